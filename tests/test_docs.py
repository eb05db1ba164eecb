"""The documentation site builds without a warning, shows what it promises, and its examples run.

``make docs`` builds docs/ with Sphinx into build/docs/; here the same build goes
to a temporary directory, with warnings as errors (-W). The docstrings' examples
of the public packages, which the API reference shows, run as doctests in a
process of their own (``pytest --doctest-modules``): examples build Keras
optimizers and TF state that the rest of the suite should not inherit.
"""

from __future__ import annotations

import html as html_lib
import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

DOCS = REPO_ROOT / "docs"
RESULTS = REPO_ROOT / "benchmarks" / "results"

# The public packages: one API reference page each (docs/api/NAME.md), and
# every module under them has its docstring examples run.
PUBLIC_PACKAGES = (
    "kungfu_tf",
    "kungfu_tf.ops",
    "kungfu_tf.optimizers",
    "kungfu_tf.keras",
    "kungfu_tf.v1",
    "kungfu_tf.policy",
    "kungfu_tf.elastic",
    "kungfu_tf.data",
    "kungfu_tf.strategy",
)
# kungfu_tf itself: its __init__ and its plain modules (its subpackages are above or internal).
TOP_LEVEL_MODULES = ("kungfu_tf/__init__.py", "kungfu_tf/variables.py")


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("KUNGFU_")}
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), out.get("PYTHONPATH")) if p)
    out.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return out


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built as ``make docs`` builds it (warnings are errors) into a temporary directory."""
    out = tmp_path_factory.mktemp("docs")
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(out / "doctrees"), str(DOCS), str(out / "html")],
        check=False, cwd=REPO_ROOT, env=env(), capture_output=True, text=True, timeout=600,
    )
    warnings = [line for line in build.stderr.splitlines() if "WARNING" in line and "absl::InitializeLog" not in line]
    assert build.returncode == 0 and not warnings, "sphinx -W failed:\n" + "\n".join(warnings or [build.stderr[-4000:]])
    return out / "html"


def page(site: Path, name: str) -> str:
    path = site / f"{name}.html"
    assert path.exists(), f"{path.relative_to(site)} was not built"
    return path.read_text()


def text_of(html: str) -> str:
    return html_lib.unescape(re.sub(r"<[^>]+>", "", html))


def element_ids(html: str) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', html))


def test_the_site_builds_without_warnings(site):
    home = page(site, "index")
    for section in ("guide/index.html", "api/index.html", "benchmarks/index.html"):
        assert f'href="{section}"' in home, f"the home page does not link {section}"


def test_every_public_package_has_its_api_page():
    pages = {p.stem for p in (DOCS / "api").glob("kungfu_tf*.md")}
    assert pages == set(PUBLIC_PACKAGES), f"API pages {sorted(pages)} differ from the public packages"


def test_the_api_reference_documents_every_public_class_and_function(site):
    """Each name a public package exports is on its page, or (a re-export kept for Horovod's names) on another's."""
    ids = set().union(*(element_ids(page(site, f"api/{p}")) for p in PUBLIC_PACKAGES))
    packages = {p: importlib.import_module(p) for p in PUBLIC_PACKAGES}
    missing = []
    for name, module in packages.items():
        for attr in module.__all__:
            obj = getattr(module, attr)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue  # submodules (their own pages) and constants
            where = [f"{p}.{attr}" for p, m in packages.items() if getattr(m, attr, None) is obj]
            if not ids & set(where):
                missing.append(f"{name}.{attr}")
    assert not missing, f"not in the API reference: {missing}"


def test_the_api_reference_shows_the_docstring_examples(site):
    html = page(site, "api/kungfu_tf.ops")
    assert 'class="doctest highlight-default' in html, "examples are not rendered as doctest blocks"
    assert "all_reduce" in html


def test_the_kungfu_run_page_holds_its_help(site):
    help_text = subprocess.run(
        [sys.executable, "-m", "kungfu_tf.run", "--help"], cwd=REPO_ROOT, env=env(), capture_output=True,
        text=True, check=True, timeout=120,
    ).stdout
    html = text_of(page(site, "api/kungfu-run"))
    for option in re.findall(r"^\s+(-{1,2}[a-z][\w-]*)", help_text, re.MULTILINE):
        assert option in html, f"kungfu-run's {option} is not on its page"
    assert "usage: kungfu-run" in html


def test_benchmark_pages_hold_every_table_and_plot_of_the_results(site):
    stems = {p.stem for p in RESULTS.glob("*.md")} | {p.stem for p in RESULTS.glob("*.png")}
    assert stems, "benchmarks/results/ holds no tables or plots"
    index = page(site, "benchmarks/index")
    for stem in sorted(stems):
        assert f'href="{stem}.html"' in index, f"the benchmark index does not link {stem}"
        html = page(site, f"benchmarks/{stem}")
        md = RESULTS / f"{stem}.md"
        if md.exists():
            tables = sum(1 for line in md.read_text().splitlines() if re.match(r"^\|\s*:?-{3,}", line))
            assert html.count("<table") == tables, f"{stem}: {tables} tables in the results, {html.count('<table')} on the page"
            rows = [line for line in md.read_text().splitlines() if line.startswith("|") and not re.match(r"^\|\s*:?-{3,}", line)]
            assert html.count("<tr") == len(rows), f"{stem}: {len(rows)} table rows in the results, {html.count('<tr')} on the page"
            text = text_of(html)
            for row in rows:
                first_cell = re.sub(r"[*`]", "", row.split("|")[1]).strip()
                assert first_cell in text, f"{stem}: the row {first_cell!r} is not on the page"
        png = RESULTS / f"{stem}.png"
        if png.exists():
            assert re.search(rf'<img [^>]*src="\.\./_images/{re.escape(png.name)}"', html), f"{stem}: the plot is not on the page"
            assert (site / "_images" / png.name).read_bytes() == png.read_bytes(), f"{png.name}: the site holds another plot"


def test_the_readme_front_door_links_resolve(site):
    """Every relative link of README.md names a file that exists, and an anchor a heading of that file has."""
    readme = (REPO_ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", re.sub(r"^```.*?^```", "", readme, flags=re.MULTILINE | re.DOTALL))
    relative = [link for link in links if not re.match(r"^[a-z]+://", link)]
    assert any(link.startswith("docs/guide/") for link in relative), relative
    for link in relative:
        path, _, anchor = link.partition("#")
        target = REPO_ROOT / path if path else REPO_ROOT / "README.md"
        assert target.exists(), f"README links to {link!r}: no such file"
        if anchor:
            headings = re.findall(r"^#{1,6} (.+)$", target.read_text(), re.MULTILINE)
            slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}
            assert anchor in slugs, f"README links to {link!r}: {path or 'README.md'} has no such heading"
    # Every guide page is on the site, reached from the guide's index.
    index = text_of(page(site, "guide/index"))
    for md in sorted((REPO_ROOT / "docs" / "guide").glob("*.md")):
        if md.stem != "index":
            title = re.search(r"^# (.+)$", md.read_text(), re.MULTILINE).group(1).replace("`", "").strip()
            assert title in index, f"guide page {md.name} ({title!r}) is not in the guide's table of contents"


def test_make_docs_builds_into_build_docs_with_warnings_as_errors():
    dry_run = subprocess.run(["make", "-n", "docs"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    assert re.search(r"-m sphinx .*-W .* docs build/docs$", dry_run, re.MULTILINE), dry_run


def test_docstring_examples_of_the_public_packages_run():
    """``pytest --doctest-modules`` over every module of the public packages, in a process of its own."""
    paths = [*TOP_LEVEL_MODULES, *(p.replace(".", "/") for p in PUBLIC_PACKAGES if p != "kungfu_tf")]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--doctest-modules", *paths],
        check=False, cwd=REPO_ROOT, env=env(), capture_output=True, text=True, timeout=900,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    passed = re.search(r"(\d+) passed", run.stdout)
    assert passed and int(passed.group(1)) >= 100, f"too few doctests ran:\n{run.stdout[-2000:]}"
