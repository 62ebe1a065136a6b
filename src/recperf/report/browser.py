"""A written report opened in headless Chromium: the page's DOM after its scripts ran, and what
the page recorded about itself on ``<body>`` once drawn (figures drawn of figures, its own layout
check, where the summary ends). The tests and ``benchmarks/report_full.py`` both read a page
through here, so the browser's flags and the page's markers are written once."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser")
TIMEOUT_S = 60


def find_chromium() -> str | None:
    """The Chromium binary on PATH, or None."""
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium_args(binary: str, profile: Path, width: int) -> list[str]:
    """Headless, offline, a fresh profile, ``width`` x 900 px, scripts given 10 s of virtual
    time (the page draws its figures after its load event)."""
    return [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        f"--user-data-dir={profile}",
        f"--window-size={width},900",
        "--virtual-time-budget=10000",
    ]


@dataclass(frozen=True)
class PageDom:
    """A page's DOM after its scripts ran, and what reached the JS console (the page logs only
    when a figure fails; Chromium logs every uncaught exception there)."""

    dom: str
    console: tuple[str, ...]

    def body_data(self, name: str) -> str | None:
        """The page's ``data-<name>`` attribute on ``<body>``, unescaped, or None."""
        body = re.search(r"<body[^>]*>", self.dom)
        found = re.search(rf'data-{name}="([^"]*)"', body.group(0)) if body else None
        return html.unescape(found.group(1)) if found else None

    def figures(self) -> tuple[int, int] | None:
        """(drawn, total) as the page recorded them, or None where it never did."""
        value = self.body_data("figures")
        marker = re.fullmatch(r"(\d+)/(\d+)", value or "")
        return (int(marker.group(1)), int(marker.group(2))) if marker else None


def dump_dom(binary: str, page: Path, profile: Path, width: int = 1400) -> PageDom:
    """``page`` at ``width`` px after its scripts ran; a RuntimeError naming Chromium's last
    words where it fails."""
    cmd = [*chromium_args(binary, profile, width), "--enable-logging=stderr", "--v=0",
           "--dump-dom", page.resolve().as_uri()]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"chromium exited {done.returncode}: {done.stderr[-2000:]}")
    console = tuple(line for line in done.stderr.splitlines() if ":CONSOLE" in line)
    return PageDom(dom=done.stdout, console=console)


def screenshot(binary: str, page: Path, profile: Path, width: int, shot: Path) -> int:
    """A ``width`` x 900 screenshot of ``page`` written to ``shot``; its size in bytes."""
    cmd = [*chromium_args(binary, profile, width), f"--screenshot={shot}", page.resolve().as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    if done.returncode != 0 or not shot.is_file():
        raise RuntimeError(f"chromium screenshot failed ({done.returncode}): {done.stderr[-2000:]}")
    return shot.stat().st_size
