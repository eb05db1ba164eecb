"""The single exception type for user errors detected before workers start."""


class LaunchError(Exception):
    """A problem with the command line or the environment of the launcher.

    The launcher prints the message as ``kungfu-run: error: ...`` and exits
    with status 2, like argparse does for syntax errors; anything else that
    escapes is a bug and keeps its traceback.
    """
