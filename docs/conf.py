"""Sphinx configuration of the kungfu_tf documentation site (``make docs`` builds it into build/docs/).

Sphinx reads the docstrings (autodoc; napoleon for their Google-style ``Args:`` /
``Example:`` sections, which also use reST roles such as :func:`...`). MyST lets
the pages be Markdown, like the README and the benchmark results they are made
from. ``_ext/generated_pages.py`` writes the guide, benchmark and CLI pages before
the sources are read. tests/test_docs.py builds the site with warnings as errors
and runs the docstrings' examples.
"""

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS.parent), str(DOCS / "_ext")]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up lines are no build output

project = "kungfu_tf"
author = "the kungfu_tf authors"
copyright = "the kungfu_tf authors"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "myst_parser",
    "generated_pages",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_ext", "_generated", ".*"]

# Docstrings: Google style; members in the order the source defines them; only
# what a package exports (__all__) and has a docstring.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_typehints = "signature"
autodoc_typehints_format = "short"

# GitHub's heading anchors (the README's links to its sections keep working).
myst_heading_anchors = 4

# Commands and options stay as typed: no curly quotes, no "--" turned into a dash.
smartquotes = False

html_theme = "alabaster"
html_title = "kungfu_tf"
html_theme_options = {
    "description": "Adaptive distributed training for TensorFlow 2.21 / Keras 3",
    "fixed_sidebar": True,
    "page_width": "1200px",
    "sidebar_width": "260px",
}
html_show_sourcelink = False
