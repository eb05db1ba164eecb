"""Sphinx extension: writes the pages that are generated from other files, before Sphinx reads the sources.

- ``benchmarks/``: one page per experiment in ``benchmarks/results/`` (the ``make bench-*``
  targets write them): its table file (``NAME.md``) as written, then its plots
  (``NAME.png``) and its raw data (``NAME.json``, a download).
- ``_generated/kungfu-run-help.txt``: what ``kungfu-run --help`` prints.

Nothing generated is kept in git (the guide, ``guide/``, is written by hand). Files are
rewritten only when their content changed (Sphinx then reads only those again) and
files no longer generated are removed, so a result deleted from ``benchmarks/results/``
does not leave a stale page behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"

# Page titles for results files that carry no "# " title of their own.
BENCHMARK_TITLES = {
    "adaptive_batch": "Adaptive batch size",
    "adaptive_topology": "Adaptive topology under link contention",
    "autoscaling": "Autoscaling, stragglers, utility vs cost",
    "elastic": "Elastic transitions",
    "elastic_admit_window": "Elastic admission window",
    "listing_one": "Listing 1: a cluster that grows with the GNS",
}

def benchmark_pages(results_dir: Path, methods_page: str | None) -> tuple[dict[str, str], dict[str, Path]]:
    """The benchmark pages (file name -> text) and the files they show (file name -> source).

    ``methods_page``: the guide page that says how the benchmarks were run, if there is one.
    """
    stems = sorted({p.stem for p in results_dir.glob("*.md")} | {p.stem for p in results_dir.glob("*.png")})
    pages: dict[str, str] = {}
    files: dict[str, Path] = {}
    for stem in stems:
        md, png, data = (results_dir / f"{stem}{ext}" for ext in (".md", ".png", ".json"))
        text = md.read_text().strip() if md.exists() else ""
        if not text.startswith("# "):
            text = f"# {BENCHMARK_TITLES.get(stem, stem.replace('_', ' ').capitalize())}\n\n{text}".strip()
        parts = [text, f"_Generated from `benchmarks/results/{stem}.*`._"]
        # The results' own links to their plot and data resolve to the copies beside the page.
        if png.exists():
            files[png.name] = png
            if f"({png.name})" not in text:
                parts.append(f"## Plot\n\n![{stem}]({png.name})")
        if data.exists():
            files[data.name] = data
            if f"({data.name})" not in text:
                parts.append(f"Raw data: {{download}}`{data.name}`")
        pages[f"{stem}.md"] = "\n\n".join(parts) + "\n"
    intro = (
        "# Benchmark results\n\n"
        "One page per experiment, generated when the site is built from the tables (`*.md`), plots\n"
        "(`*.png`) and raw data (`*.json`) that the `make bench-*` targets write to\n"
        "`benchmarks/results/`.\n"
    )
    if methods_page:
        intro += f"The [guide's benchmarks page](../guide/{methods_page}) says how each was measured.\n"
    toctree = "\n".join(["```{toctree}", ":maxdepth: 1", "", *(Path(p).stem for p in pages), "```"])
    pages["index.md"] = intro + "\n" + toctree + "\n"
    return pages, files


def kungfu_run_help() -> str:
    """``kungfu-run --help`` as a user's terminal of 88 columns shows it."""
    script = Path(sys.executable).with_name("kungfu-run")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "kungfu_tf.run"]
    env = dict(os.environ, COLUMNS="88", PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([*cmd, "--help"], capture_output=True, text=True, check=True, env=env, timeout=120).stdout


def write_if_changed(path: Path, content: bytes) -> None:
    if path.exists() and path.read_bytes() == content:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(content)
    os.replace(tmp, path)


def sync_dir(directory: Path, texts: dict[str, str], files: dict[str, Path] | None = None) -> None:
    """Makes ``directory`` hold exactly these pages and files."""
    wanted = {name: text.encode() for name, text in texts.items()}
    wanted.update({name: src.read_bytes() for name, src in (files or {}).items()})
    for name, content in wanted.items():
        write_if_changed(directory / name, content)
    for path in directory.iterdir() if directory.exists() else ():
        if path.is_file() and path.name not in wanted and not path.name.startswith("."):
            path.unlink(missing_ok=True)
        elif path.is_dir():
            shutil.rmtree(path, ignore_errors=True)


def generate(srcdir: Path) -> None:
    methods = "benchmarks.md" if (srcdir / "guide" / "benchmarks.md").exists() else None
    sync_dir(srcdir / "benchmarks", *benchmark_pages(RESULTS_DIR, methods))
    sync_dir(srcdir / "_generated", {"kungfu-run-help.txt": kungfu_run_help()})


def setup(app):
    app.connect("builder-inited", lambda app: generate(Path(app.srcdir)))
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
