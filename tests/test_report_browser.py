"""Open the report in a real headless Chromium and check every image decodes and renders.

A checker script is appended to a COPY of the report (the report itself carries no script): on
the page's load event it writes each image's decoded size into the DOM, which ``--dump-dom``
returns. A deliberately corrupted copy proves the check catches a broken image.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from wattclass.report.build import render_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")

CHECKER = """
<script>
window.addEventListener('load', function () {
  var r = Array.prototype.map.call(document.images, function (i) {
    return {alt: i.alt, complete: i.complete, w: i.naturalWidth, h: i.naturalHeight,
            shown_w: i.getBoundingClientRect().width};
  });
  var pre = document.createElement('pre');
  pre.id = 'imgcheck';
  pre.textContent = 'IMGCHECK' + JSON.stringify(r) + 'END';
  document.body.appendChild(pre);
});
</script>
"""


def _images_in_browser(page: str, tmp: Path) -> list[dict[str, object]]:
    html_path = tmp / "page.html"
    html_path.write_text(page.replace("</body>", CHECKER + "</body>"))
    assert CHROMIUM is not None
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp / 'profile'}",
        "--window-size=1200,900",
        "--virtual-time-budget=10000",
        "--dump-dom",
        html_path.as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    m = re.search(r'<pre id="imgcheck">IMGCHECK(.*?)END</pre>', proc.stdout, re.S)
    assert m, f"chromium gave no check result (rc {proc.returncode}): {proc.stderr[-2000:]}"
    return list(json.loads(m.group(1).replace("&quot;", '"')))


@pytest.fixture(scope="module")
def page() -> str:
    root = Path(__file__).resolve().parent.parent / "wattclass" / "data" / "h200"
    w = pd.read_parquet(root / "telemetry.parquet")
    metrics = {"accuracy": 0.9, "labels": ["compute", "memory"], "confusion": [[8, 1], [1, 10]]}
    decisions = pd.DataFrame(
        {
            "job_id": ["1", "2"],
            "label": ["memory", "compute"],
            "status": ["shadow", "none"],
            "reason": ["shadow", "low_confidence"],
            "cap": ["60%", None],
        }
    )
    return render_report(w, None, metrics, decisions)


def test_every_image_decodes_and_is_laid_out(page: str, tmp_path: Path) -> None:
    imgs = _images_in_browser(page, tmp_path)
    assert len(imgs) == page.count("<img ") == 6
    for img in imgs:
        assert img["complete"] is True, img
        assert int(str(img["w"])) > 300 and int(str(img["h"])) > 150, f"image did not decode: {img}"
        assert float(str(img["shown_w"])) > 100, f"image not laid out: {img}"


def test_the_check_catches_a_broken_image(page: str, tmp_path: Path) -> None:
    start = page.index("base64,") + len("base64,")
    broken = page[: start + 40] + "A" * 200 + page[start + 240 :]  # clobber the first PNG's header chunks
    imgs = _images_in_browser(broken, tmp_path)
    assert len(imgs) == 6
    assert int(str(imgs[0]["w"])) == 0, "a corrupted PNG must not decode"
    assert all(int(str(i["w"])) > 0 for i in imgs[1:])
