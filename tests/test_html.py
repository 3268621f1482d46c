"""The HTML report: one self-contained file, and it renders in a real browser (headless
Chromium, Debian's package) with plots, no script errors and a screenshot that is not blank."""

import re
import shutil
import struct
import subprocess
import zlib

import pytest

from solbound.cli import main

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("html") / "report.html"
    assert main(["analyze", "examples/mlp_block.py", "--arch", "h100-sxm,jetson-orin",
                 "--html", str(out), "-q"]) == 0
    return out


def test_the_report_is_one_self_contained_file(report):
    text = report.read_text()
    # no script or stylesheet from the network: plotly's JavaScript is inlined
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=\"http", text)
    assert "Plotly.newPlot" in text and text.count('class="plotly-graph-div"') == 3
    for heading in ("Bounds", "Across chips", "Operators", "Modules"):
        assert f"<h2>{heading}" in text
    assert "onclick=\"sortTable(this)\"" in text and "mlp_block.py:" in text   # source lines


def _pixels_vary(png: bytes) -> bool:
    """The decoded image has more than a handful of distinct byte values."""
    pos, idat = 8, b""
    while pos < len(png):
        n, kind = struct.unpack(">I4s", png[pos:pos + 8])
        if kind == b"IDAT":
            idat += png[pos + 8:pos + 8 + n]
        pos += 12 + n
    return len(set(zlib.decompress(idat))) > 16


def test_the_report_renders_in_headless_chromium(report, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("headless Chromium is not installed here (.ci/run installs Debian's "
                    "chromium): the browser check did not run")
    profile = ["--user-data-dir=" + str(tmp_path / "profile")]
    dom = subprocess.run([browser, *FLAGS, *profile, "--virtual-time-budget=8000", "--dump-dom",
                          report.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    # plotly drew every figure: one SVG root (two layers) per plot
    assert dom.stdout.count('class="main-svg"') >= 2 * 3
    shot = tmp_path / "shot.png"
    run = subprocess.run([browser, *FLAGS, *profile, "--enable-logging=stderr", "--v=0",
                          "--virtual-time-budget=8000", "--window-size=1200,1600",
                          f"--screenshot={shot}", report.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and shot.exists()
    errors = [line for line in run.stderr.splitlines()
              if "CONSOLE" in line and ("Uncaught" in line or "Error" in line)]
    assert errors == []
    assert _pixels_vary(shot.read_bytes())


def test_kernelbench_summary_page_has_a_headroom_distribution_per_fidelity():
    from solbound.kernelbench import summary_html
    rows = [{"level": lv, "name": f"p{i}", "status": "ok", "validated": "skipped",
             "bytes_unfused": 4.0, "bytes_fused": 2.0, "sol_fused_s": 1.0,
             "sol_cache_aware_s": 1.5, "headroom_eager": 3.0 + i, "headroom_compile": 2.0 + i,
             "headroom_eager_unfused": 1.5 + i, "headroom_eager_cache_aware": 2.0 + i}
            for lv in (1, 2) for i in range(3)]
    page = summary_html(rows).replace("\\u002f", "/")     # plotly's JSON escapes "/"
    assert "Plotly.newPlot" in page and not re.search(r"<script[^>]+src=", page)
    for name in ("eager / fused", "compile / fused", "eager / unfused", "eager / cache-aware"):
        assert name in page
    assert "<td>1</td>" in page and "<td>2</td>" in page       # the per-level table rows
