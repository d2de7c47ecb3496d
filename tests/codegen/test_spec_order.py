"""The order in which a spec lists its `parameters` and its `contexts` never crashes the
generator: every order generates a package that decodes and encodes like the spec's own order,
or the spec is refused with exit 2 and a spec error.

Parameters are told apart by their kind, so their order means nothing: the generator takes the
version first, then the modes, and the output is the same file for file. The contexts' order is
the order of the gate tuples and of a capture file's flag bits, so the files differ in that
order, but the codec behaves the same through its keyword API.

Every spec the project generates (spec/*.yaml, tests/specs/*.yaml) is rendered through the
`python -m codegen generate` entry point in this process, once per order.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import shutil
from pathlib import Path

import pytest
import yaml

from codegen.__main__ import ERROR, OK, main
from codegen.loader import load_spec
from codegen.sample import Entry, Sample, load_sample, messages_for_gates, session_records
from codegen.targets.kaitai import load_fresh_codec

pytestmark = pytest.mark.fast  # no Java, PostgreSQL server or npm

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted(
    p for p in (ROOT / "spec").glob("*.yaml") if not p.name.endswith(".sample.yaml")
) + sorted((ROOT / "tests" / "specs").glob("*.yaml"))


def _orders(n: int) -> list[tuple[int, ...]]:
    """Index orders of a list of n items, the spec's own first: every permutation of up to
    three items, else the reversed order and both rotations by one."""
    if n <= 3:
        return list(itertools.permutations(range(n)))
    ident = tuple(range(n))
    return [ident, ident[::-1], ident[1:] + ident[:1], ident[-1:] + ident[:-1]]


def _variants() -> list:
    out = []
    for path in SPECS:
        raw = _read(path)
        params, contexts = raw["parameters"], raw["contexts"]
        for po, co in itertools.product(_orders(len(params)), _orders(len(contexts))):
            if po == tuple(range(len(params))) and co == tuple(range(len(contexts))):
                continue  # the spec's own order: the baseline
            label = "{}-params({})-contexts({})".format(
                path.stem,
                ",".join(params[i]["name"] for i in po),
                ",".join(contexts[i]["name"] for i in co),
            )
            out.append(pytest.param(path, po, co, id=label))
    return out


_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):
    def ignore_aliases(self, data):
        return True


def _read(path: Path) -> dict:
    return yaml.load(path.read_text(), Loader=_Loader)  # noqa: S506 - a safe loader


@dataclasses.dataclass
class Generated:
    spec_file: Path
    spec: object  # codegen.model.Spec
    files: dict  # path under the output folder -> bytes
    codec: object


def _generate(source: Path, po, co, where: Path, capsys) -> tuple[int, str, Generated | None]:
    """Write the spec with its lists in the given orders and run `codegen generate` on it:
    (exit code, stderr, what it generated)."""
    raw = _read(source)
    raw["parameters"] = [raw["parameters"][i] for i in po]
    raw["contexts"] = [raw["contexts"][i] for i in co]
    where.mkdir(parents=True)
    spec_file = where / source.name  # one name for every order: the same file headers
    spec_file.write_text(yaml.dump(raw, Dumper=_Dumper, sort_keys=False, allow_unicode=True))
    sample = raw["targets"].get("sample")
    if sample:
        shutil.copy(source.parent / sample, where / sample)
    out = where / "out"
    capsys.readouterr()
    code = main(["generate", "--spec", str(spec_file), "--out", str(out)])
    err = capsys.readouterr().err
    if code != OK:
        return code, err, None
    spec = load_spec(spec_file, display_name=spec_file.name)
    files = {
        p.relative_to(out).as_posix(): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and ".codegen" not in p.relative_to(out).parts
    }
    package = spec.targets.package + "/"
    sources = {
        rel: data.decode()
        for rel, data in files.items()
        if rel.startswith(package) and rel.endswith(".py")
    }
    return code, err, Generated(spec_file, spec, files, load_fresh_codec(sources, spec.targets))


_BASELINES: dict = {}


@pytest.fixture
def baseline(tmp_path_factory, capsys):
    def get(source: Path) -> Generated:
        if source not in _BASELINES:
            raw = _read(source)
            where = tmp_path_factory.mktemp(f"{source.stem}-baseline") / "spec"
            same = tuple(range(len(raw["parameters"]))), tuple(range(len(raw["contexts"])))
            code, err, gen = _generate(source, *same, where, capsys)
            assert code == OK, err
            _BASELINES[source] = gen
        return _BASELINES[source]

    return get


# -- comparing -----------------------------------------------------------------------------
def _plain(value):
    """A decoded value without its classes (each generated package has its own): nested
    (class name, ((field, value), ...)) tuples."""
    if dataclasses.is_dataclass(value):
        return (
            type(value).__name__,
            tuple((f.name, _plain(getattr(value, f.name))) for f in dataclasses.fields(value)),
        )
    if isinstance(value, (tuple, list)):
        return tuple(_plain(v) for v in value)
    return value


def _call_args(spec) -> list[dict]:
    """Every combination of the keyword arguments decode() and encode() take."""
    names = [p.name for p in spec.parameters] + [c.name for c in spec.per_message_contexts]
    choices = [p.values for p in spec.parameters] + [(False, True)] * len(spec.per_message_contexts)
    return [dict(zip(names, combo)) for combo in itertools.product(*choices)]


def _gates(spec, codec, kwargs: dict) -> dict | None:
    """The gate values the codec resolves the arguments to, by name; None when it refuses them."""
    args = [kwargs[p.name] for p in spec.parameters]
    args += [kwargs[c.name] for c in spec.per_message_contexts]
    try:
        gates = codec.PARAMS.resolve(*args)
    except ValueError:
        return None
    return dict(zip([spec.version.name, *(c.name for c in spec.contexts)], gates))


def _corpus(gen: Generated) -> Sample:
    """The spec's sample session, or for a spec without one every message with default values."""
    sample = load_sample(gen.spec, gen.spec_file)
    if sample is not None:
        return sample
    params = {p.name: p.values[-1] for p in gen.spec.parameters}
    entries = tuple(Entry(m.name, {}, 0) for m in gen.spec.messages)
    return Sample(gen.spec_file.name, params, 0, 0, {}, entries)


def _same_codec(base: Generated, other: Generated) -> None:
    spec = base.spec
    corpus = _corpus(base)
    checked = 0
    for kwargs in _call_args(spec):
        want = _gates(spec, base.codec, kwargs)
        assert _gates(other.spec, other.codec, kwargs) == want, kwargs
        if want is None:
            continue
        gates = tuple(want[n] for n in [spec.version.name, *(c.name for c in spec.contexts)])
        for msg in messages_for_gates(spec, corpus, base.codec, gates):
            wire = base.codec.encode(msg, **kwargs)
            got = other.codec.decode(wire, **kwargs)
            assert _plain(got) == _plain(msg), (kwargs, msg)
            assert other.codec.encode(got, **kwargs) == wire, (kwargs, msg)
            checked += 1
    assert checked, "no message was compared"


def _record(spec, r) -> dict:
    names = [spec.version.name, *(c.name for c in spec.contexts), "lsn", "data"]
    return {n: getattr(r, n) for n in names}


def _same_session(base: Generated, other: Generated) -> None:
    """The sample session: the same capture records (by field name), which the other codec's
    capture files keep, and the same messages out of its stream decoder."""
    sample = load_sample(base.spec, base.spec_file)
    if sample is None:
        return
    want = session_records(base.spec, sample, base.codec)
    got = session_records(other.spec, load_sample(other.spec, other.spec_file), other.codec)
    assert [_record(other.spec, r) for r in got] == [_record(base.spec, r) for r in want]
    assert other.codec.capture.loads(other.codec.capture.dumps(got)) == got
    base_dec = base.codec.StreamDecoder(**sample.parameters)
    other_dec = other.codec.StreamDecoder(**sample.parameters)
    for r in want:
        assert _plain(other_dec.decode(r.data)) == _plain(base_dec.decode(r.data))


_HASH = re.compile(rb'^SPEC_SHA256 = "[0-9a-f]+"$', re.M)


def _without_hash(files: dict) -> dict:
    return {rel: _HASH.sub(b"SPEC_SHA256 = ...", data) for rel, data in files.items()}


# -- the test --------------------------------------------------------------------------------
@pytest.mark.parametrize(("source", "param_order", "context_order"), _variants())
def test_any_order_generates_the_same_codec(
    source, param_order, context_order, tmp_path, capsys, baseline
):
    base = baseline(source)
    code, err, gen = _generate(source, param_order, context_order, tmp_path / "spec", capsys)
    assert code in (OK, ERROR), err
    if code == ERROR:  # refused: a spec error with the file, line and YAML path
        assert re.search(rf"spec error: \S*{re.escape(source.name)}:\d+:\d+: \S", err), err
        return
    if [c.name for c in gen.spec.contexts] == [c.name for c in base.spec.contexts] and [
        p.name for p in gen.spec.modes
    ] == [p.name for p in base.spec.modes]:
        # only the version moved: nothing but the spec's hash may differ
        assert _without_hash(gen.files) == _without_hash(base.files)
    _same_codec(base, gen)
    _same_session(base, gen)


def test_a_version_with_a_default_after_a_mode_keeps_its_meaning(tmp_path, capsys, baseline):
    """Listed after a mode and with a default (so no syntax error gives it away), the version
    still is the version: decode(protocol_version=4) used to get the mode's value instead."""
    source = ROOT / "spec" / "pgoutput.yaml"
    base = baseline(source)
    text = source.read_text().replace("    kind: version\n", "    kind: version\n    default: 4\n")
    assert "default: 4" in text
    edited = tmp_path / "edited" / source.name
    edited.parent.mkdir()
    edited.write_text(text)
    shutil.copy(source.with_name("pgoutput.sample.yaml"), edited.parent)
    raw = yaml.load(text, Loader=_Loader)  # noqa: S506 - a safe loader
    order = tuple(reversed(range(len(raw["parameters"]))))
    code, err, gen = _generate(
        edited, order, tuple(range(len(raw["contexts"]))), tmp_path / "o", capsys
    )
    assert code == OK, err
    assert [p.kind for p in gen.spec.parameters] == ["version", "mode"]
    _same_codec(base, gen)
    # the version's default: the spec's, not the mode's
    wire = base.codec.encode(base.codec.StreamStop(), protocol_version=4)
    assert _plain(gen.codec.decode(wire)) == _plain(base.codec.StreamStop())
