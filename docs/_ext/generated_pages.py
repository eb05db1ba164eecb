"""Sphinx extension: writes the pages that are generated from other files, before Sphinx reads the sources.

- ``guide/``: one page per ``## `` section of README.md, its headings one level up; a link
  to a heading of another section points at that section's page, an image at its file.
  The README stays the one copy of this text (the sections move here later: README.md's
  front door keeps a pointer per moved section).
- ``benchmarks/``: one page per experiment in ``benchmarks/results/`` (the ``make bench-*``
  targets write them): its table file (``NAME.md``) as written, then its plots
  (``NAME.png``) and its raw data (``NAME.json``, a download).
- ``_generated/kungfu-run-help.txt``: what ``kungfu-run --help`` prints.

Nothing generated is kept in git. Files are rewritten only when their content
changed (Sphinx then reads only those again) and files no longer generated are
removed, so a section deleted from the README does not leave a stale page behind.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
README = REPO_ROOT / "README.md"
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

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def github_slug(title: str) -> str:
    """The anchor GitHub (and MyST's ``myst_heading_anchors``) gives a heading."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def page_name(title: str) -> str:
    """A short file name for a section: its title up to the first ``:``, ``,`` or ``(``."""
    return github_slug(re.split(r"[:,(]", title, maxsplit=1)[0]).strip("-") or "section"


def outside_code(lines: list[str]):
    """Yields (index, line, in_code) for every line, in_code for lines of fenced blocks (fences included)."""
    fence = None
    for i, line in enumerate(lines):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            yield i, line, True
        elif fence is not None:
            if line.strip().startswith(fence):
                fence = None
            yield i, line, True
        else:
            yield i, line, False


@dataclass
class Section:
    title: str
    name: str
    lines: list[str] = field(default_factory=list)
    anchors: set[str] = field(default_factory=set)


def split_readme(text: str) -> tuple[list[str], list[Section]]:
    """README.md's text before its first ``## `` heading, and one Section per ``## `` heading."""
    intro: list[str] = []
    sections: list[Section] = []
    names: set[str] = set()
    lines = text.splitlines()
    for _, line, in_code in outside_code(lines):
        m = None if in_code else HEADING.match(line)
        if m and len(m.group(1)) == 2:
            name = base = page_name(m.group(2))
            n = 2
            while name in names or name == "index":
                name, n = f"{base}-{n}", n + 1
            names.add(name)
            sections.append(Section(m.group(2), name))
        if m and sections:
            sections[-1].anchors.add(github_slug(m.group(2)))
        (sections[-1].lines if sections else intro).append(line)
    return intro, sections


def rewrite_links(text: str, here: str | None, anchor_page: dict[str, str], page_dir: Path) -> str:
    """Points the README-relative links of some Markdown (no code blocks) at the site's pages and files."""

    def replace(m: re.Match) -> str:
        bang, label, target = m.groups()
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, mailto:, ...
            return m.group(0)
        if target.startswith("#"):
            page = anchor_page.get(target[1:])
            if page is None or page == here:
                return m.group(0)  # a missing anchor stays: the strict build names it
            return f"[{label}]({page}.md{target})"
        path = (REPO_ROOT / target.split("#", 1)[0]).resolve()
        if bang and path.parent == RESULTS_DIR:
            return f"![{label}](../benchmarks/{path.name})"  # the benchmark pages' copy
        if bang:
            return f"![{label}]({os.path.relpath(path, page_dir)})"
        return f"{label} (`{target}`)"  # a repository file, not a page of the site

    return LINK.sub(replace, text)


def to_page(lines: list[str], here: str | None, anchor_page: dict[str, str], page_dir: Path) -> str:
    """README lines as a page: headings one level up (the ``## `` title becomes the page's), links rewritten."""
    out: list[str] = []
    prose: list[str] = []  # lines outside code since the last code block: a link may span lines

    def flush():
        if prose:
            out.append(rewrite_links("\n".join(prose), here, anchor_page, page_dir))
            prose.clear()

    for _, line, in_code in outside_code(lines):
        if in_code:
            flush()
            out.append(line)
            continue
        m = HEADING.match(line)
        if m and len(m.group(1)) == 1:
            continue  # the README's own title
        prose.append("#" * (len(m.group(1)) - 1) + " " + m.group(2) if m else line)
    flush()
    return "\n".join(out).strip() + "\n"


def guide_pages(readme_text: str, page_dir: Path) -> dict[str, str]:
    """The guide pages (file name -> text) made from README.md."""
    intro, sections = split_readme(readme_text)
    anchor_page = {a: s.name for s in sections for a in s.anchors}
    pages = {f"{s.name}.md": to_page(s.lines, s.name, anchor_page, page_dir) for s in sections}
    toctree = "\n".join(["```{toctree}", ":maxdepth: 2", "", *(s.name for s in sections), "```"])
    pages["index.md"] = "# Guide\n\n" + to_page(intro, None, anchor_page, page_dir) + "\n" + toctree + "\n"
    return pages


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
    guide = guide_pages(README.read_text(), srcdir / "guide")
    sync_dir(srcdir / "guide", guide)
    sync_dir(srcdir / "benchmarks", *benchmark_pages(RESULTS_DIR, "benchmarks.md" if "benchmarks.md" in guide else None))
    sync_dir(srcdir / "_generated", {"kungfu-run-help.txt": kungfu_run_help()})


def setup(app):
    app.connect("builder-inited", lambda app: generate(Path(app.srcdir)))
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
