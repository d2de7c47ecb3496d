"""decode_messages on the JVM: the generated Java decoder of a codec, run by Spark as a UDF.

The Python engine (.batches) hands every batch to a Python worker and back, and that
round trip alone is slower than the JVM decoding the bytes itself. Here the codec's generated
Java class (``<package>/jvm/*.java``, rendered from the spec) and the hand-written runtime
(``pgcdc/runtime/spark/java/*.java``) are compiled with javac against Spark's jars into jars
kept in a per-user cache, added to the session (the executors fetch them), and the decoder is
registered as a UDF taking (data, context key) and returning struct(message, decode_error).

The jars are keyed by a hash of their sources and the Spark version: compiled once, then
reused (a JRE without javac can use a jar that is already there). Several processes may build
the same jar at once: each writes a temporary file and renames it into place.

Each build's classes live in a package named by that hash (``pgcdc.jvm.v<hash>``,
``pgcdc.codec.v<hash>``): a JVM outlives a Python process in a notebook whose Python restarts
after a ``pip install``, and with fixed names its class loader would go on handing out the
classes of whichever version it loaded first.

The cache is ``$PGCDC_JVM_CACHE``, else ``$XDG_CACHE_HOME/pgcdc/jvm``, else
``~/.cache/pgcdc/jvm``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
import zipfile
from itertools import product
from pathlib import Path
from pgcdc.errors import SetupError

__all__ = ["ENGINES", "JvmUnavailable", "cache_dir", "decode_messages_jvm", "jvm_jars"]

log = logging.getLogger("pgcdc.spark")

ENGINES = ("auto", "jvm", "python")
RUNTIME_SOURCES = Path(__file__).with_name("java")  # the hand-written Java runtime
JAVA_RELEASE = "17"  # Spark 4 runs on Java 17 or later
_BUILD_ID = "pgcdc-jvm-2"  # bump when the way the jars are built changes
# the packages the sources are written in; each build renames them (see above)
RUNTIME_PACKAGE = "pgcdc.jvm"
CODEC_PACKAGE = "pgcdc.codec"
_TMP = "__pgcdc_decoded"

_lock = threading.Lock()
# (codec module, its Java source, Spark version) -> (its jars, the decoder's class name)
_jars: dict[tuple, tuple[list[Path], str]] = {}
_added: set[tuple] = set()  # (application id, jar) already added to a session
_noticed: set[str] = set()


class JvmUnavailable(SetupError, RuntimeError):
    """The JVM engine cannot run here (no javac and no cached jar, a failed compile, a Spark
    Connect session): engine="auto" falls back to the Python engine."""


def cache_dir() -> Path:
    env = os.environ.get("PGCDC_JVM_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pgcdc" / "jvm"


def _javac() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "javac"), os.X_OK):
        return os.path.join(home, "bin", "javac")
    return shutil.which("javac")


def _spark_jars_dir() -> Path:
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    if not jars.is_dir() and os.environ.get("SPARK_HOME"):
        jars = Path(os.environ["SPARK_HOME"]) / "jars"
    if not jars.is_dir():
        raise JvmUnavailable("Spark's jars were not found (pyspark/jars or $SPARK_HOME/jars)")
    return jars


def _digest(sources: list[Path], *extra: str) -> str:
    h = hashlib.sha256()
    for part in (_BUILD_ID, JAVA_RELEASE, *extra):
        h.update(part.encode() + b"\0")
    for path in sorted(sources, key=lambda p: p.name):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:24]


def _build(name: str, digest: str, sources: list[Path], classpath: list[Path], renames) -> Path:
    """The jar ``<name>-<digest>.jar`` of `sources` with their packages renamed (``renames``:
    {package: its name in this build}), compiled against `classpath` (Spark's jars and earlier
    jars of ours): from the cache or compiled now."""
    directory = cache_dir()
    jar = directory / f"{name}-{digest}.jar"
    if jar.exists():
        return jar
    javac = _javac()
    if javac is None:
        raise JvmUnavailable("no javac on PATH or in $JAVA_HOME/bin (a JRE alone cannot compile)")
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".build-") as tmp:
        classes, renamed = Path(tmp) / "classes", Path(tmp) / "src"
        classes.mkdir()
        renamed.mkdir()
        for source in sources:
            (renamed / source.name).write_text(
                _renamed(source.read_text("utf-8"), renames), "utf-8"
            )
        cp = os.pathsep.join(str(p) for p in classpath)
        cmd = [javac, "--release", JAVA_RELEASE, "-nowarn", "-encoding", "UTF-8"]
        cmd += ["-d", str(classes), "-cp", cp, *(str(renamed / s.name) for s in sources)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise JvmUnavailable(f"javac failed on {name}:\n{proc.stderr.strip()}")
        staged = Path(tmp) / "staged.jar"
        with zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
            for path in sorted(classes.rglob("*.class")):
                z.write(path, path.relative_to(classes).as_posix())
        os.replace(staged, jar)  # atomic: a concurrent build renames an identical jar
    return jar


def _renamed(text: str, renames: dict[str, str]) -> str:
    """Java source with its package and import lines moved to the packages of this build
    (the sources name the packages only there)."""
    pattern = "|".join(re.escape(p) for p in sorted(renames, key=len, reverse=True))
    line = re.compile(rf"^(\s*(?:package|import)\s+)({pattern})(?=[.;])", re.M)
    return line.sub(lambda m: m.group(1) + renames[m.group(2)], text)


def jvm_jars(codec, spark_version: str) -> tuple[list[Path], str]:
    """The runtime's jar and the codec's, compiled once per sources and Spark version, and the
    name of the codec's decoder class in them."""
    source = codec.jvm_source()
    key = (codec.module, str(source), spark_version)
    with _lock:
        if key not in _jars:
            try:
                _jars[key] = _jars_of(codec, source, spark_version)
            except OSError as exc:  # a cache that cannot be written, a javac that cannot run
                raise JvmUnavailable(f"cannot build the decoder's jar: {exc}") from exc
        return _jars[key]


def _jars_of(codec, source: Path | None, spark_version: str) -> tuple[list[Path], str]:
    if source is None or not source.exists():
        raise JvmUnavailable(f"{codec.module} has no generated Java decoder")
    cls = codec.jvm_class
    if not cls.startswith(CODEC_PACKAGE + "."):
        raise JvmUnavailable(f"{codec.module}: {cls} is not in the package {CODEC_PACKAGE}")
    spark_cp = sorted(_spark_jars_dir().glob("*.jar"))
    spark_names = [p.name for p in spark_cp]
    runtime_sources = sorted(RUNTIME_SOURCES.glob("*.java"))
    runtime_digest = _digest(runtime_sources, spark_version, *spark_names)
    runtime_package = f"{RUNTIME_PACKAGE}.v{runtime_digest}"
    renames = {RUNTIME_PACKAGE: runtime_package}
    runtime = _build("pgcdc-runtime", runtime_digest, runtime_sources, spark_cp, renames)
    digest = _digest([source], spark_version, runtime_digest, *spark_names)
    renames[CODEC_PACKAGE] = f"{CODEC_PACKAGE}.v{digest}"
    package = codec.module.rsplit(".", 1)[0]
    own = _build(package, digest, [source], [runtime, *spark_cp], renames)
    return [runtime, own], renames[CODEC_PACKAGE] + cls[len(CODEC_PACKAGE) :]


def _add_jars(spark, jars: list[Path]) -> None:
    """Add the jars to the session once: the driver's class loader and the executors'."""
    app = spark.sparkContext.applicationId
    loader = spark._jsparkSession.sessionState().resourceLoader()
    for jar in jars:
        if (app, str(jar)) in _added:
            continue
        loader.addJar(jar.as_uri())
        _added.add((app, str(jar)))


def _instance(spark, class_name: str):
    jvm = spark.sparkContext._jvm
    gateway = spark.sparkContext._gateway
    loader = spark._jsparkSession.sharedState().jarClassLoader()
    cls = jvm.java.lang.Class.forName(class_name, True, loader)
    constructor = cls.getDeclaredConstructor(gateway.new_array(jvm.java.lang.Class, 0))
    return constructor.newInstance(gateway.new_array(jvm.java.lang.Object, 0))


def _quoted(column: str) -> str:
    return "`" + column.replace("`", "``") + "`"


def notice_fallback(codec, reason: str) -> None:
    """One line in the log, once per codec and reason, when engine="auto" falls back."""
    key = f"{codec.module}:{reason}"
    if key not in _noticed:
        _noticed.add(key)
        first = reason.splitlines()[0] if reason else "unavailable"
        log.warning("decode_messages: the JVM engine is unavailable (%s); using Python", first)


def prepare(codec, spark) -> str:
    """The decoder's class name, its jars added to the session; JvmUnavailable unless the JVM
    engine can run on this session."""
    if not hasattr(spark, "_jsparkSession"):
        raise JvmUnavailable("not a classic (py4j) SparkSession")
    if codec.jvm_class is None:
        raise JvmUnavailable(f"{codec.module} was generated without a JVM decoder")
    jars, cls = jvm_jars(codec, spark.version)
    _add_jars(spark, jars)
    return cls


def context_keys(params, args: tuple, contexts) -> dict[int, tuple | str]:
    """Per context key (each given context column false/true/null as 0/1/2, base 3): the gate
    values (version, contexts...), or the reason every row with that key fails."""
    per_message = [c.name for c in params.per_message]
    out: dict[int, tuple | str] = {}
    for flags in product((False, True, None), repeat=len(contexts)):
        key = sum((0 if f is False else 1 if f is True else 2) * 3**i for i, f in enumerate(flags))
        null = [col for (_, _, col), flag in zip(contexts, flags) if flag is None]
        if null:
            out[key] = f"the {null[0]} column is null"
            continue
        given = dict.fromkeys(per_message, False)
        given.update((name, flag) for (name, _, _), flag in zip(contexts, flags))
        try:
            out[key] = tuple(int(v) for v in params.resolve(*args, *given.values()))
        except ValueError as exc:
            out[key] = str(exc)
    return out


def decode_messages_jvm(codec, df, data_col: str, args: tuple, contexts, failfast: bool, hint):
    """decode_messages' DataFrame with the JVM engine (the checks of the arguments are done):
    df's columns, then `message` and, unless failfast, `decode_error`."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    spark = df.sparkSession
    cls = prepare(codec, spark)
    udf = _instance(spark, cls)
    udf.setFailfast(bool(failfast))
    udf.setHint(hint)
    config = [cls, str(failfast), hint]
    for key, value in sorted(context_keys(codec.decoder.PARAMS, args, contexts).items()):
        if isinstance(value, str):
            udf.setError(key, value)
        else:
            udf.setGates(key, ",".join(map(str, value)))
        config.append(f"{key}={value!r}")
    returns = StructType(
        [
            StructField("message", codec.message_schema, True),
            StructField("decode_error", StringType(), True),
        ]
    )
    name = "pgcdc_decode_" + hashlib.sha256("\0".join(config).encode()).hexdigest()[:16]
    jtype = spark._jsparkSession.parseDataType(returns.json())
    spark._jsparkSession.udf().register(name, udf, jtype)
    key = F.lit(0)
    for i, (_, _, column) in enumerate(contexts):
        c = F.col(_quoted(column))
        code = F.when(c.isNull(), F.lit(2)).when(c, F.lit(1)).otherwise(F.lit(0))
        key = key + code * F.lit(3**i)
    out = df.withColumn(_TMP, F.call_function(name, F.col(_quoted(data_col)), key))
    out = out.withColumn("message", F.col(_TMP).getField("message"))
    if not failfast:
        out = out.withColumn("decode_error", F.col(_TMP).getField("decode_error"))
    return out.drop(_TMP)
