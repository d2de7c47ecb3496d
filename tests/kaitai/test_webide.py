"""The README's Kaitai steps, done in a real browser: the Kaitai Web IDE (its stable build,
kept beside the repository in ../shared/kaitai-webide for tests only) served on 127.0.0.1 and
driven in headless Chromium (Debian's `chromium`) with Playwright.

For each spec the test drags the generated .ksy pair into the IDE, selects the capture .ksy,
drags in the sample capture, and then checks what a person would see: no Errors panel, no
warning icon anywhere in the fully opened object tree, one `Record` (showing its message's tag)
per record that the codec's own `capture.read` finds, and field values shown in the tree equal
to the codec's decode. The IDE's eager "export to JSON" is compared with the codec record by
record. A screenshot of the IDE, with a message body opened, is saved under tmp_path and its
path printed (also when the test fails).

Missing tools fail the test (CI installs them): chromium by `.ci/run`, Playwright by the
`test` extra. Playwright drives the system chromium; `playwright install` is never needed."""

from __future__ import annotations

import base64
import dataclasses
import functools
import importlib
import json
import re
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IDE_DIR = ROOT.parent / "shared" / "kaitai-webide"
KAITAI = ROOT / "generated" / "kaitai"
SAMPLES = ROOT / "generated" / "samples"
TIMEOUT_MS = 30_000


@dataclasses.dataclass(frozen=True)
class Case:
    package: str  # the codec whose capture module reads the sample
    capture_ksy: str
    message_ksy: str
    sample: str
    root_class: str  # the capture .ksy's root type as the IDE names it


CASES = [
    Case(
        "pgoutput_codec",
        "pgoutput_capture.ksy",
        "pgoutput_message.ksy",
        "pgoutput_sample.pgcap",
        "PgoutputCapture",
    ),
    Case(
        "replication_codec",
        "replication_capture.ksy",
        "replication_message.ksy",
        "replication_sample.pgrcap",
        "ReplicationCapture",
    ),
]

# Run once the IDE's app exists: count finished compiles and parses (the IDE calls both
# through the instance), so the test waits on them instead of sleeping.
INSTRUMENT_JS = """() => {
  const app = window.kaitaiIde.app;
  if (window.__ide) return;
  window.__ide = {recompiles: 0, reparses: 0, lastRecompileError: null};
  for (const name of ["recompile", "reparse"]) {
    const orig = app[name].bind(app);
    app[name] = async (...args) => {
      try {
        const r = await orig(...args);
        if (name === "recompile") window.__ide.lastRecompileError = null;
        return r;
      } catch (e) {
        if (name === "recompile") window.__ide.lastRecompileError = String(e && e.error || e);
        throw e;
      } finally { window.__ide[name + "s"]++; }
    };
  }
}"""

# The Errors panel exists only while the IDE shows an error.
ERROR_TEXT_JS = """() => {
  const el = document.querySelector(".errorWindow");
  return el ? el.innerText.trim() : null;
}"""

TREE_READY_JS = """() => !!document.querySelector(".errorWindow") ||
  window.kaitaiIde.app.ui.parsedDataTreeCont.getElement()[0]
        .querySelectorAll(".jstree-anchor").length > 0"""

# Open every node of the object tree (loading each on the way, as clicks would), then read
# back each node's text and the tooltips of the warning icons the IDE puts on nodes whose
# parse failed or was cut short.
OPEN_ALL_JS = """async () => {
  const tree = window.kaitaiIde.app.ui.parsedDataTreeHandler.jstree;
  await new Promise(done => {
    tree.get_container().one("open_all.jstree", () => done());
    tree.open_all();
  });
  const el = window.kaitaiIde.app.ui.parsedDataTreeCont.getElement()[0];
  return {
    nodes: el.querySelectorAll(".jstree-anchor").length,
    warnings: Array.from(el.querySelectorAll(".jstree-anchor .glyphicon"))
      .map(i => i.closest(".jstree-anchor").textContent.trim() + ": " + i.title),
  };
}"""

# Select a node and open it, as clicking it does; returns the texts of the nodes it shows.
OPEN_PATH_JS = """async path => {
  const handler = window.kaitaiIde.app.ui.parsedDataTreeHandler;
  await handler.activatePath(path);
  const id = "inputField-" + path.split("/").join("-");
  await new Promise(done => handler.jstree.open_node(id, done, false));  // no animation
  const node = document.getElementById(id);
  return Array.from(node.querySelectorAll(":scope > ul > li > .jstree-anchor"))
    .map(a => a.textContent.trim());
}"""


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


@pytest.fixture(scope="module")
def ide_url():
    """The IDE served from a thread on 127.0.0.1, on a port the OS picks."""
    if not (IDE_DIR / "index.html").is_file():
        pytest.fail(
            f"the Kaitai Web IDE build is missing: expected {IDE_DIR.name}/index.html in "
            "../shared/ beside the repository"
        )
    handler = functools.partial(_QuietHandler, directory=str(IDE_DIR))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser():
    """Headless Debian chromium, launched by Playwright."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright is not installed: pip install -e '.[test]'")
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        pytest.fail("chromium is not installed: apt-get install -y chromium (.ci/run does it)")
    with sync_playwright() as p:
        try:
            # --no-sandbox: Chromium refuses to start as root without it.
            b = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        except Exception as err:
            pytest.fail(f"cannot launch {executable} headless: {err}")
        try:
            yield b
        finally:
            b.close()


# Drop files on the page as a drag from the file manager does: the IDE's drop handler is on
# <body> and stores what it gets like its upload button (several files are only stored; a
# single one is opened too).
DROP_JS = """files => {
  const dt = new DataTransfer();
  for (const f of files)
    dt.items.add(new File([Uint8Array.from(atob(f.data), c => c.charCodeAt(0))], f.name));
  document.body.dispatchEvent(
    new DragEvent("drop", {dataTransfer: dt, bubbles: true, cancelable: true}));
}"""


def _drop(page, paths):
    """Drag files into the IDE, as the README tells users to."""
    files = [{"name": p.name, "data": base64.b64encode(p.read_bytes()).decode()} for p in paths]
    page.evaluate(DROP_JS, files)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _shown(value) -> str:
    """A codec value as the IDE's tree shows it after `name = `: integers as hex = decimal,
    byte arrays as their first 8 bytes, strings (their decoded `<name>Text` instance) as is."""
    if isinstance(value, bytes):
        return "[" + ", ".join([str(b) for b in value[:8]] + ["..."] * (len(value) > 8)) + "]"
    if isinstance(value, int):
        return f"{'-' * (value < 0)}0x{abs(value):X} = {value}"
    return value


def _tag_name(msg) -> str:
    """The IDE's name of the message's tag (its enum), e.g. XLOG_DATA for XLogData."""
    return re.sub(r"(?<=[a-z])(?=[A-Z])", "_", type(msg).__name__).upper()


def _record_line(index: int, record) -> str:
    """A record's node in the tree: the capture .ksy's representation shows the message tag."""
    return f"{index} [Record]: {_tag_name(record.decode())}"


def _shows(lines: list[str], name: str, value) -> bool:
    """Whether the tree's lines show the field: a string as its `<name>Text` instance, a
    one-character code as the enum the .ksy makes of it, a number or bytes as `_shown`."""
    key = _camel(name)
    if isinstance(value, str):
        if len(value) == 1 and any(
            t.startswith(f"{key} = ") and t.endswith(f"({_shown(ord(value))})") for t in lines
        ):
            return True
        return f"{key}Text = {value}" in lines
    return f"{key} = {_shown(value)}" in lines


def _scalar_fields(msg) -> dict:
    """The message's own ints, strings and bytes (no nested objects, no absent parts)."""
    return {
        f.name: getattr(msg, f.name)
        for f in dataclasses.fields(msg)
        if isinstance(getattr(msg, f.name), (int, str, bytes))
        and not isinstance(getattr(msg, f.name), bool)
    }


def _same(shown, value, where: str) -> None:
    """One decoded value against the IDE's export of it: dataclasses field by field (absent
    parts skipped), sequences item by item, strings as their bytes and their decoded
    `<name>Text` instance, one-character codes as the enum the .ksy makes of them."""
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            item, key = getattr(value, f.name), _camel(f.name)
            if item is None:
                continue
            if isinstance(item, str) and key + "Text" in shown:
                assert shown[key + "Text"] == item, f"{where}.{f.name}"
                item = item.encode("utf-8", "surrogateescape")
            assert key in shown, f"{where}.{f.name} is not in the IDE's tree"
            _same(shown[key], item, f"{where}.{f.name}")
    elif isinstance(value, tuple | list):
        assert len(shown) == len(value), where
        for i, (s, v) in enumerate(zip(shown, value, strict=True)):
            _same(s, v, f"{where}[{i}]")
    elif isinstance(value, bytes):
        assert bytes(shown) == value, where
    elif isinstance(value, str):  # a one-byte code with choices: an enum in the .ksy
        assert shown["value"] == ord(value), where
    else:
        assert shown == value, where


def _compare_export(exported: dict, records) -> None:
    """The IDE's eager parse, record by record, against the codec's."""
    assert len(exported["records"]) == len(records)
    for i, (shown, rec) in enumerate(zip(exported["records"], records, strict=True)):
        where = f"records[{i}]"
        assert shown["lsn"] == rec.lsn, where
        assert shown["lenMessage"] == len(rec.data), where
        msg = rec.decode()
        assert shown["message"]["tag"] == {"name": _tag_name(msg), "value": rec.data[0]}, where
        _same(shown["message"]["body"], msg, f"{where}.message.body")


@pytest.mark.parametrize("case", CASES, ids=[c.package for c in CASES])
def test_readme_kaitai_steps_in_the_web_ide(case, ide_url, browser, tmp_path):
    codec = importlib.import_module(case.package)
    sample = SAMPLES / case.sample
    records = codec.capture.read(sample)  # the truth the IDE is checked against
    assert records, f"{sample.name} holds no records"

    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    page, external = None, []

    def only_local(route):
        if route.request.url.startswith(ide_url):
            route.continue_()
        else:
            external.append(route.request.url)
            route.abort()

    try:
        context.route("**/*", only_local)
        # Skip the welcome dialog, which would cover the page.
        context.add_init_script("localStorage.setItem('doNotShowWelcome', 'true')")
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)

        # Boot: the IDE opens its own zip.ksy and sample1.zip and parses them.
        page.goto(ide_url + "index.html")
        page.wait_for_function("window.kaitaiIde && window.kaitaiIde.app")
        page.evaluate(INSTRUMENT_JS)
        page.wait_for_function("window.kaitaiIde.root !== undefined")

        # README step 1: add both .ksy files (several files at once are only stored).
        _drop(page, [KAITAI / case.capture_ksy, KAITAI / case.message_ksy])
        for name in (case.capture_ksy, case.message_ksy):
            page.locator("#fileTree a.jstree-anchor", has_text=name).first.wait_for()

        # README step 2: select the capture .ksy (compiled 500 ms later, then the input still
        # open, sample1.zip, is reparsed with it: that transient error is expected) ...
        compiles = page.evaluate("window.__ide.recompiles")
        page.locator("#fileTree a.jstree-anchor", has_text=case.capture_ksy).first.click()
        page.wait_for_function(f"window.__ide.recompiles > {compiles}")
        error = page.evaluate("window.__ide.lastRecompileError")
        assert error is None, f"the IDE cannot compile {case.capture_ksy}:\n{error}"

        # ... then add the sample: a single file is opened as the input and parsed at once.
        parses = page.evaluate("window.__ide.reparses")
        _drop(page, [sample])
        page.wait_for_function(f"window.__ide.reparses > {parses}")
        page.wait_for_function(TREE_READY_JS)
        page.wait_for_timeout(200)  # the Errors panel is added asynchronously
        error = page.evaluate(ERROR_TEXT_JS)
        assert error is None, f"the IDE shows an error parsing {sample.name}:\n{error}"
        assert page.evaluate("window.kaitaiIde.app.inputFsItem.fn") == sample.name
        assert page.evaluate("window.kaitaiIde.root.object.class") == case.root_class

        # README step 3: the records, as the tree shows them, each with its message's tag.
        shown = page.evaluate(OPEN_PATH_JS, "records")
        assert [_record_line(i, r) for i, r in enumerate(records)] == shown

        # Every node opened: nothing failed or was cut short, and the panel stays empty.
        opened = page.evaluate(OPEN_ALL_JS)
        assert opened["warnings"] == [], "tree nodes with a warning icon"
        assert opened["nodes"] > 10 * len(records)
        error = page.evaluate(ERROR_TEXT_JS)
        assert error is None, f"the IDE shows an error once the tree is opened:\n{error}"
        page.evaluate("window.kaitaiIde.app.ui.parsedDataTreeHandler.jstree.close_all()")

        # The first record's message: its tag and body type, as shown.
        first = records[0]
        shown = page.evaluate(OPEN_PATH_JS, "records/0/message")
        assert f"tag = {_tag_name(first.decode())} ({_shown(first.data[0])})" in shown
        assert f"body [{type(first.decode()).__name__}]".lower() in (t.lower() for t in shown)

        # A body with a string (or else bytes): its fields shown as the codec decodes them.
        index = next(
            (
                i
                for want in (str, bytes)
                for i, r in enumerate(records)
                if any(isinstance(v, want) for v in _scalar_fields(r.decode()).values())
            ),
            0,
        )
        msg = records[index].decode()
        shown = page.evaluate(OPEN_PATH_JS, f"records/{index}/message/body")
        for name, value in _scalar_fields(msg).items():
            assert _shows(shown, name, value), (f"records/{index}/message/body", name, shown)
        screenshot = tmp_path / f"webide-{case.package}.png"
        page.screenshot(path=str(screenshot))
        print(f"screenshot: {screenshot}")

        # The whole parse, eagerly (as "export to JSON" does), record by record.
        _compare_export(
            json.loads(page.evaluate("require('ExportToJson').exportToJson(false)")), records
        )
        assert external == [], "the IDE asked for something outside 127.0.0.1"
    except Exception:
        if page is not None:
            screenshot = tmp_path / f"webide-{case.package}-failed.png"
            page.screenshot(path=str(screenshot))
            print(f"screenshot of the failure: {screenshot}")
        raise
    finally:
        context.close()
