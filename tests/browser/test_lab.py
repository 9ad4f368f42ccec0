"""The course in a real JupyterLab, driven through Chromium.

1. Chapter 02: run all cells, move one rank's token slider with the keyboard,
   and check that the global mean on the page is exactly what
   ``course_lib.core.arithmetic.global_mean`` gives for the values now shown,
   and that the plot shown is the one drawn for those values (its PNG, byte
   for byte), before and after the move.
2. Chapter 05: opened without running, its committed outputs render,
   figures included.
3. Chapter 01: a graded prediction: a wrong value gets a hint, the right one
   "correct", and the answer never shows on the page.

Screenshots go to ``runs/screenshots/``.
"""

from __future__ import annotations

import base64
import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from course_lib.core.arithmetic import global_mean, mean_of_means
from course_lib.course.widgets import TokenExplorer

pytestmark = pytest.mark.browser

RUN_ALL_TIMEOUT_MS = 240_000
KERNEL_TIMEOUT_S = 120.0
UPDATE_TIMEOUT_S = 60.0
RUN_MENU = re.compile(r"^Run$")
RUN_ALL = re.compile(r"^Run All Cells$")
NUMBER = re.compile(r"-?\d+\.\d{4}(?!\d)")
# The visible notebook: the tests share one page, and earlier tests leave
# their tabs open.
SHOWN = ".jp-NotebookPanel:not(.lm-mod-hidden)"
IDLE = f"{SHOWN} .jp-Notebook-ExecutionIndicator[data-status='idle']"


def _notebook(lab_server, name: str):
    path = lab_server.root_dir / name
    assert path.is_file(), (
        f"{path} does not exist: the browser test needs this chapter "
        "(it fails rather than skips, so a missing chapter cannot go unnoticed)")
    return path


def _open(page, name: str) -> None:
    """Open the chapter in a new tab of the loaded app (docmanager:open, the
    command behind a double click in the file browser)."""
    page.evaluate("async (path) => {"
                  " await window.jupyterapp.commands.execute('docmanager:open', {path}); }",
                  name)
    page.locator(".lm-TabBar-tab.lm-mod-current", has_text=name.rsplit("/", 1)[-1]
                 ).first.wait_for(state="visible")
    page.locator(f"{SHOWN} .jp-Cell").first.wait_for(
        state="visible")


def _wait_kernel_ready(page, lab_server, name: str) -> None:
    """Until the server has an idle kernel for this notebook; accept the kernel
    dialog with its preselected (preferred) kernel should it still appear."""
    deadline = time.monotonic() + KERNEL_TIMEOUT_S
    dialog = page.locator(".jp-Dialog", has_text="Select Kernel")
    while time.monotonic() < deadline:
        if dialog.count() and dialog.first.is_visible():
            dialog.first.locator(".jp-mod-accept").click()
        _, sessions = lab_server.api("/api/sessions")
        states = [s["kernel"]["execution_state"] for s in sessions
                  if s.get("path", "").endswith(name) and s.get("kernel")]
        if "idle" in states:
            page.wait_for_selector(IDLE)
            return
        page.wait_for_timeout(250)  # polling interval only
    pytest.fail(f"no idle kernel for {name} after {KERNEL_TIMEOUT_S:.0f} s:\n"
                f"{lab_server.log_tail()}")


def _run_all(page) -> None:
    """Run > Run All Cells from the menu bar, then wait until every code cell ran."""
    page.locator("#jp-MainMenu .lm-MenuBar-item",
                 has=page.locator(".lm-MenuBar-itemLabel", has_text=RUN_MENU)).click()
    page.locator(".lm-Menu .lm-Menu-item",
                 has=page.locator(".lm-Menu-itemLabel", has_text=RUN_ALL)).click()
    page.wait_for_function(
        """(shown) => {
            const prompts = [...document.querySelectorAll(
                shown + ' .jp-CodeCell .jp-InputPrompt')];
            return prompts.length > 0
                && prompts.every(p => /^\\[\\d+\\]:$/.test(p.textContent.trim()));
        }""",
        arg=SHOWN, polling=250, timeout=RUN_ALL_TIMEOUT_MS)
    page.wait_for_selector(IDLE,
                           timeout=RUN_ALL_TIMEOUT_MS)


def _readout(page, css_class: str) -> str:
    loc = page.locator(f"{SHOWN} .{css_class} .widget-readout").first
    loc.wait_for(state="visible")
    return loc.inner_text().strip()


def _shown_values(page) -> tuple[list[float], list[int], str, str]:
    """(loss sums, token counts) from the sliders on the page, and both readouts."""
    world = int(_readout(page, "course-world-size"))
    counts = [int(_readout(page, f"course-tokens-r{r}")) for r in range(world)]
    per_token = [float(_readout(page, f"course-loss-r{r}")) for r in range(world)]
    sums = [loss * n for loss, n in zip(per_token, counts, strict=True)]
    gm = page.locator(f"{SHOWN} .course-global-mean").first.inner_text().strip()
    mm = page.locator(f"{SHOWN} .course-mean-of-means").first.inner_text().strip()
    return sums, counts, gm, mm


def _fmt4(x: float) -> str:
    """As the widget prints it: four decimals, never '-0.0000'."""
    s = f"{x:.4f}"
    return "0.0000" if s == "-0.0000" else s


def _number(text: str) -> str:
    found = NUMBER.findall(text)
    assert len(found) == 1, f"expected one 4-decimal number in {text!r}"
    return found[0]


# The bytes of the explorer's figure as the page shows it: null while the
# image is still loading (a new src not decoded yet) or its blob is gone.
SHOWN_PNG = """async (shown) => {
    let img = document.querySelector(shown + ' .course-token-figure');
    if (img && img.tagName !== 'IMG') img = img.querySelector('img');
    if (!img || !img.complete || !img.naturalWidth) return null;
    try {
        const bytes = new Uint8Array(await (await fetch(img.src)).arrayBuffer());
        let s = '';
        for (let i = 0; i < bytes.length; i++) s += String.fromCharCode(bytes[i]);
        return btoa(s);
    } catch (e) { return null; }
}"""


def _shown_png(page) -> bytes | None:
    shown = page.evaluate(SHOWN_PNG, SHOWN)
    return None if shown is None else base64.b64decode(shown)


def _expected_png(page, counts: list[int]) -> bytes:
    """The figure the explorer draws for the sliders now shown, drawn here by
    a fresh explorer (same code, same matplotlib: the same bytes)."""
    losses = [float(_readout(page, f"course-loss-r{r}")) for r in range(len(counts))]
    return TokenExplorer(counts, losses, len(counts)).image.value


def _consistent_state(page, timeout: float = UPDATE_TIMEOUT_S):
    """Poll until the readouts and the plot agree with the sliders shown (the
    kernel answers asynchronously, and the plot arrives as its own message);
    return the last state seen, with whether the plot agreed."""
    deadline = time.monotonic() + timeout
    while True:
        sums, counts, gm, mm = _shown_values(page)
        expected = (_fmt4(global_mean(sums, counts)), _fmt4(mean_of_means(sums, counts)))
        numbers_agree = (_number(gm), _number(mm)) == expected
        plot_agrees = numbers_agree and _shown_png(page) == _expected_png(page, counts)
        if plot_agrees or time.monotonic() > deadline:
            return sums, counts, gm, mm, expected, plot_agrees
        page.wait_for_timeout(200)  # polling interval only


def test_token_explorer_global_mean_follows_the_slider(page, lab_server, screenshots):
    _notebook(lab_server, "01_mean_of_means.ipynb")
    _open(page, "01_mean_of_means.ipynb")
    _wait_kernel_ready(page, lab_server, "01_mean_of_means.ipynb")
    _run_all(page)

    handle = page.locator(f"{SHOWN} .course-tokens-r1 .noUi-handle").first
    handle.wait_for(state="visible", timeout=RUN_ALL_TIMEOUT_MS)
    page.locator(f"{SHOWN} .course-global-mean").first.wait_for(state="visible")
    sums0, counts0, gm0, _, expected0, plot0 = _consistent_state(page)
    assert _number(gm0) == expected0[0], (
        f"before any change the page shows {gm0!r}, expected {expected0[0]} "
        f"for loss sums {sums0} and counts {counts0}")
    assert plot0, f"before any change the plot is not the one for counts {counts0}"
    handle.scroll_into_view_if_needed()
    page.screenshot(path=str(screenshots / "01_token_explorer-before.png"))

    # move rank 1's token slider with the keyboard, as a user would
    handle.focus()
    for _ in range(3):
        handle.press("ArrowLeft" if counts0[1] > 3 else "ArrowRight")
    page.wait_for_function(
        "([sel, old]) => { const e = document.querySelector(sel);"
        " return e && e.textContent.trim() !== old; }",
        arg=[f"{SHOWN} .course-tokens-r1 .widget-readout", str(counts0[1])], polling=100,
        timeout=30_000)

    sums1, counts1, gm1, mm1, expected1, plot1 = _consistent_state(page)
    page.screenshot(path=str(screenshots / "01_token_explorer-after.png"))
    assert counts1[1] != counts0[1], "rank 1's token count did not move"
    assert counts1[:1] == counts0[:1] and counts1[2:] == counts0[2:], "another rank moved"
    assert _number(gm1) == expected1[0], (
        f"page shows {gm1!r}; global_mean({sums1}, {counts1}) = {expected1[0]}")
    assert _number(mm1) == expected1[1], (
        f"page shows {mm1!r}; mean_of_means({sums1}, {counts1}) = {expected1[1]}")
    assert plot1, (f"the numbers say counts {counts1} and global mean {gm1!r}, "
                   f"but the plot shown is not the one drawn for them")
    assert _number(gm1) != _number(gm0), "the global mean did not change"
    assert "global mean" in gm1.lower()


def test_parity_chapter_renders_committed_outputs(page, lab_server, screenshots):
    path = _notebook(lab_server, "04_ddp_parity.ipynb")
    cells = json.loads(path.read_text())["cells"]
    pngs = sum("image/png" in out.get("data", {})
               for cell in cells if cell["cell_type"] == "code"
               for out in cell.get("outputs", []))
    assert pngs >= 1, "04_ddp_parity.ipynb has no committed PNG output (parity figure)"

    _open(page, "04_ddp_parity.ipynb")
    images = page.locator(f"{SHOWN} .jp-OutputArea-output img[src^='data:image/png']")
    images.first.wait_for(state="attached", timeout=60_000)
    page.wait_for_function(
        """([shown, n]) => {
            const imgs = [...document.querySelectorAll(
                shown + ' .jp-OutputArea-output img[src^="data:image/png"]')];
            return imgs.length >= n && imgs.every(i => i.complete && i.naturalWidth > 0);
        }""", arg=[SHOWN, pngs], polling=250, timeout=60_000)
    assert images.count() == pngs, f"{images.count()} figures rendered, {pngs} committed"
    first = images.first
    first.scroll_into_view_if_needed()
    box = first.bounding_box()
    assert box and box["width"] > 100 and box["height"] > 100, f"figure too small: {box}"
    page.screenshot(path=str(screenshots / "04_ddp_parity.png"))
    prompts = page.locator(f"{SHOWN} .jp-CodeCell .jp-InputPrompt").all_inner_texts()
    assert not any("*" in p for p in prompts), "the chapter was executed, not just opened"


@pytest.mark.parametrize("name, prompt, not_yet", [
    ("01_mean_of_means.ipynb", "Rank 0:", "not yet"),
    # The French edition: its first code cell sets COURSE_EDITION=fr.
    ("fr/01_mean_of_means.ipynb", "Rang 0 :", "pas encore")])
def test_a_graded_prediction_hints_then_says_correct(page, lab_server, screenshots, name,
                                                     prompt, not_yet):
    _notebook(lab_server, name)
    _open(page, name)
    _wait_kernel_ready(page, lab_server, name)
    _run_all(page)
    quiz = page.locator(f"{SHOWN} .course-question").first
    quiz.wait_for(state="visible", timeout=RUN_ALL_TIMEOUT_MS)
    box = quiz.locator(".course-question-input input").first
    verdict = quiz.locator(".course-question-verdict").first
    button = quiz.locator(".course-question-check button, button.course-question-check")

    def answer(text: str) -> str:
        before = verdict.inner_text().strip()  # read before the click can change it
        box.fill(text)
        box.press("Enter")  # the text box syncs on Enter
        button.first.click()
        page.wait_for_function(
            "([el, old]) => el.textContent.trim() !== old",
            arg=[verdict.element_handle(), before], polling=100, timeout=30_000)
        return verdict.inner_text().strip()

    quiz.scroll_into_view_if_needed()
    # French typography joins "Rang 0" and its colon with a no-break space
    shown = quiz.inner_text().replace("\xa0", " ").strip()
    assert shown.startswith(prompt), shown[:80]
    edition = name.split("/")[0] + "-" if "/" in name else ""
    wrong = answer("2.5")
    page.screenshot(path=str(screenshots / f"{edition}01_prediction-wrong.png"))
    assert wrong.startswith(not_yet) and "correct" not in wrong, wrong
    assert "2.0" not in wrong and not re.search(r"\b2\b", wrong), "the answer leaked"
    right = answer("2")
    page.screenshot(path=str(screenshots / f"{edition}01_prediction-right.png"))
    assert right == "correct", right


def test_healthcheck_endpoint_needs_no_token(lab_server):
    """The Dockerfile's HEALTHCHECK polls /api without a token: that must work,
    while the contents API stays behind the token."""
    status, body = lab_server.api("/api", auth=False)
    assert status == 200 and "version" in body
    with pytest.raises(urllib.error.HTTPError) as denied:
        lab_server.api("/api/contents", auth=False)
    assert denied.value.code == 403
    assert lab_server.api("/api/contents")[0] == 200


def test_lab_runs_quiet_and_isolated(lab_server):
    """No news popup, no update check, no autosave into the notebook sources."""
    def composite(plugin: str) -> dict:
        _, body = lab_server.api(f"/lab/api/settings/{plugin}")
        return body["settings"]

    note = composite("@jupyterlab/apputils-extension:notification")
    assert note["fetchNews"] == "false" and note["checkForUpdates"] is False
    assert composite("@jupyterlab/docmanager-extension:plugin")["autosave"] is False
    req = urllib.request.Request(f"{lab_server.url}/lab",
                                 headers={"Authorization": f"token {lab_server.token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        html = resp.read().decode()
    config = json.loads(re.search(r'id="jupyter-config-data"[^>]*>(.*?)</script>',
                                  html, re.S).group(1))
    assert config["news"] == {"disabled": True}
    environ = dict(item.split("=", 1) for item in
                   Path(f"/proc/{lab_server.proc.pid}/environ").read_text().split("\0")
                   if "=" in item)
    base = lab_server.log.parent
    for var in ("HOME", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR",
                "IPYTHONDIR"):
        assert Path(environ[var]).parent == base, f"{var} is not isolated: {environ[var]}"
    assert environ["COURSE_PROGRESS"] == "text"
