"""A headless Chromium for looking at ``reports/eval.html`` as a browser draws it: a screenshot of the page and its
DOM after its scripts ran. Used by ``tests/test_html_report.py`` and to make the manual's screenshot of the report::

    .venv/bin/python -m dflash_eval.testing.browser reports/eval.html docs/images/eval_html.png --size 1280x2400

The browser is Debian's ``chromium`` package (``apt-get install -y chromium``; ``.ci/run`` installs it) or its
``chromium-headless-shell`` (the same engine without a window, a smaller install), or the binary named by
``$DFLASH_EVAL_CHROMIUM``; each call runs it once with a fresh profile folder, without GPU, and
without the sandbox when run as root (the page is a local file this package wrote). Every call has a timeout, after
which the browser's process group is killed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["BrowserError", "find_chromium", "screenshot", "dump_dom", "page_url", "main"]

#: Binaries tried in order when ``$DFLASH_EVAL_CHROMIUM`` is not set.
NAMES = ("chromium", "chromium-browser", "chromium-headless-shell", "google-chrome", "google-chrome-stable")
TIMEOUT_S = 120.0


class BrowserError(RuntimeError):
    """The browser could not be run, timed out, or wrote nothing."""


def find_chromium() -> str | None:
    """The browser binary: ``$DFLASH_EVAL_CHROMIUM`` (which must exist), else the first of :data:`NAMES` on PATH."""
    env = os.environ.get("DFLASH_EVAL_CHROMIUM")
    if env:
        return env if shutil.which(env) else None
    return next((p for n in NAMES if (p := shutil.which(n))), None)


def page_url(page: Path | str, query: str = "") -> str:
    """``file://`` URL of a local page (``query``: ``method=ddtree-8`` and the like)."""
    return Path(page).resolve().as_uri() + (f"?{query}" if query else "")


def _run(extra: list[str], *, timeout: float) -> str:
    exe = find_chromium()
    if exe is None:
        raise BrowserError("no Chromium found (set $DFLASH_EVAL_CHROMIUM or apt-get install -y chromium)")
    with tempfile.TemporaryDirectory(prefix="dflash-eval-chromium-") as profile:
        args = [exe, "--headless", "--disable-gpu", "--hide-scrollbars", "--no-first-run", "--mute-audio",
                "--disable-dev-shm-usage", f"--user-data-dir={profile}"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:  # Chromium refuses to run as root inside its sandbox
            args.append("--no-sandbox")
        proc = subprocess.Popen(args + extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise BrowserError(f"{exe} did not finish within {timeout:.0f} s ({' '.join(extra)})") from None
    if proc.returncode != 0:
        raise BrowserError(f"{exe} exited with status {proc.returncode}: {err.strip()[-2000:]}")
    return out


def screenshot(page: Path | str, png: Path, *, width: int = 1280, height: int = 1600, query: str = "",
               timeout: float = TIMEOUT_S) -> Path:
    """A PNG of the page's first ``width`` x ``height`` CSS pixels (the window's size) at ``png``."""
    png = Path(png).resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    png.unlink(missing_ok=True)
    _run([f"--window-size={width},{height}", f"--screenshot={png}", page_url(page, query)], timeout=timeout)
    if not png.is_file() or png.stat().st_size == 0:
        raise BrowserError(f"the browser wrote no screenshot to {png}")
    return png


def dump_dom(page: Path | str, *, query: str = "", timeout: float = TIMEOUT_S) -> str:
    """The page's DOM as HTML after it loaded and its scripts ran."""
    dom = _run(["--dump-dom", page_url(page, query)], timeout=timeout)
    if "<body" not in dom:
        raise BrowserError(f"the browser dumped no DOM for {page}: {dom[:200]!r}")
    return dom


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dflash_eval.testing.browser",
                                 description="Screenshot of a report page (eval.html) in headless Chromium.")
    ap.add_argument("page", type=Path, help="the page, e.g. reports/eval.html")
    ap.add_argument("png", type=Path, help="where the PNG goes")
    ap.add_argument("--size", default="1280x1600", help="window WIDTHxHEIGHT in CSS pixels (default 1280x1600)")
    ap.add_argument("--query", default="", help="URL query of the page, e.g. method=ddtree-8")
    ns = ap.parse_args(argv)
    try:
        width, height = (int(v) for v in ns.size.lower().split("x"))
    except ValueError:
        ap.error(f"--size {ns.size!r}: expected WIDTHxHEIGHT, e.g. 1280x1600")
    if not ns.page.is_file():
        ap.error(f"{ns.page}: no such page")
    try:
        print(screenshot(ns.page, ns.png, width=width, height=height, query=ns.query))
    except BrowserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
