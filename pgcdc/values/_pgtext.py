"""PostgreSQL's text forms, computed offline: dates and times (DateStyle ISO), intervals
(IntervalStyle postgres), floats (shortest exact digits) and the XSD date/time forms that
``to_jsonb`` writes. Dates use the proleptic Gregorian calendar with astronomical years
(year 0 is 1 BC), as PostgreSQL does."""

from __future__ import annotations

import math
import re
import struct
from datetime import date, datetime, time, timezone

USECS_PER_DAY = 86_400_000_000
PG_EPOCH_DAYS = 730_120  # date(2000, 1, 1).toordinal()
_PG_EPOCH = datetime(2000, 1, 1)
DATE_PINF, DATE_NINF = 0x7FFFFFFF, -0x80000000
TS_PINF, TS_NINF = 0x7FFFFFFFFFFFFFFF, -0x8000000000000000


# --- calendar --------------------------------------------------------------------------------


def civil_from_days(days: int) -> tuple[int, int, int]:
    """(year, month, day) of ``days`` after 2000-01-01 (H. Hinnant's algorithm)."""
    z = days + 10_957 + 719_468  # days from 0000-03-01
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (m <= 2), m, d


def days_from_civil(y: int, m: int, d: int) -> int:
    """Days from 2000-01-01 to (y, m, d) (astronomical year)."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - 719_468 - 10_957


def _year_text(y: int) -> tuple[str, str]:
    return (f"{y:04d}", "") if y > 0 else (f"{1 - y:04d}", " BC")


def _fraction(usec: int) -> str:
    return f".{usec:06d}".rstrip("0") if usec else ""


def _offset_text(seconds: int, xsd: bool) -> str:
    """PostgreSQL's time zone suffix: +HH[:MM[:SS]] in ISO; XSD always has the minutes."""
    sign = "-" if seconds < 0 else "+"
    h, rest = divmod(abs(seconds), 3600)
    m, s = divmod(rest, 60)
    out = f"{sign}{h:02d}"
    if m or s or xsd:
        out += f":{m:02d}"
    if s:
        out += f":{s:02d}"
    return out


def format_date(days: int, xsd: bool = False) -> str:
    if days == DATE_PINF:
        return "infinity"
    if days == DATE_NINF:
        return "-infinity"
    y, m, d = civil_from_days(days)
    year, bc = _year_text(y)
    return f"{year}-{m:02d}-{d:02d}{bc}"


def format_time(usec: int) -> str:
    s, frac = divmod(usec, 1_000_000)
    h, rest = divmod(s, 3600)
    return f"{h:02d}:{rest // 60:02d}:{rest % 60:02d}{_fraction(frac)}"


def format_timestamp(usec: int, tz: bool, xsd: bool = False) -> str:
    """A timestamp (microseconds from 2000-01-01, UTC for timestamptz) as PostgreSQL prints
    it with DateStyle ISO and TimeZone UTC; ``xsd``: as ``to_jsonb`` writes it."""
    if usec == TS_PINF:
        return "infinity"
    if usec == TS_NINF:
        return "-infinity"
    days, rest = divmod(usec, USECS_PER_DAY)
    y, m, d = civil_from_days(days)
    year, bc = _year_text(y)
    sep = "T" if xsd else " "
    zone = _offset_text(0, xsd) if tz else ""
    return f"{year}-{m:02d}-{d:02d}{sep}{format_time(rest)}{zone}{bc}"


_DATETIME_TEXT = re.compile(
    r"(\d{4,})-(\d\d)-(\d\d)"
    r"(?:[ T](\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?)?"
    r"(?:([+-])(\d\d)(?::?(\d\d))?(?::(\d\d))?)?"
    r"( BC)?"
)


def parse_datetime_text(text: str) -> tuple[int, bool]:
    """PostgreSQL's ISO text of a date or timestamp[tz] as (microseconds from 2000-01-01 in
    UTC, whether it had a time part); infinity as TS_PINF/TS_NINF."""
    if text == "infinity":
        return TS_PINF, True
    if text == "-infinity":
        return TS_NINF, True
    m = _DATETIME_TEXT.fullmatch(text)
    if m is None:
        raise ValueError(f"not a date/time in ISO DateStyle: {text!r}")
    y, mo, d, hh, mi, ss, frac, sign, th, tm, ts, bc = m.groups()
    year = int(y)
    if bc:
        year = 1 - year
    usec = days_from_civil(year, int(mo), int(d)) * USECS_PER_DAY
    if hh is not None:
        usec += ((int(hh) * 60 + int(mi)) * 60 + int(ss)) * 1_000_000
        usec += int((frac or "").ljust(6, "0") or 0)
    if sign:
        off = (int(th) * 60 + int(tm or 0)) * 60 + int(ts or 0)
        usec -= (off if sign == "+" else -off) * 1_000_000
    return usec, hh is not None


def datetime_to_usec(dt: datetime) -> int:
    """Microseconds from 2000-01-01 (UTC for an aware datetime)."""
    if dt.tzinfo is not None:
        dt = dt.astimezone(timezone.utc).replace(tzinfo=None)
    delta = dt - _PG_EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _trim_fraction(text: str, usec: int) -> str:
    # isoformat writes 6 fraction digits; PostgreSQL drops the trailing zeros
    if usec and usec % 10 == 0:
        head, _, rest = text.partition(".")
        frac, zone = rest[:6], rest[6:]
        return f"{head}.{frac.rstrip('0')}{zone}"
    return text


def xsd_datetime(value: datetime) -> str:
    """A datetime as ``to_jsonb`` writes it; an aware one converted to UTC."""
    if value.tzinfo is not None and value.tzinfo is not timezone.utc and value.utcoffset():
        value = value.astimezone(timezone.utc)
    return _trim_fraction(value.isoformat(), value.microsecond)


def pg_datetime_text(value: datetime) -> str:
    """A datetime as PostgreSQL prints it (DateStyle ISO; an aware one in UTC)."""
    if value.tzinfo is not None:
        value = value.astimezone(timezone.utc)
        zone = "+00"
    else:
        zone = ""
    frac = _fraction(value.microsecond)
    return f"{value.year:04d}-{value.month:02d}-{value.day:02d} {value.hour:02d}:" + (
        f"{value.minute:02d}:{value.second:02d}{frac}{zone}"
    )


def pg_time_text(value: time) -> str:
    """A time or timetz as PostgreSQL prints it (``12:00:00.5+05:30``)."""
    text = f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}{_fraction(value.microsecond)}"
    off = value.utcoffset()
    if off is not None:
        text += _offset_text(int(off.total_seconds()), False)
    return text


def pg_date_text(value: date) -> str:
    return value.isoformat()


def out_of_range_xsd(type_oid: int, text: str) -> str:
    """The ``to_jsonb`` form of an OutOfRange date/timestamp text (others stay as they are)."""
    if type_oid in (1114, 1184) and text not in ("infinity", "-infinity"):
        usec, _ = parse_datetime_text(text)
        return format_timestamp(usec, type_oid == 1184, xsd=True)
    return text


# --- intervals -------------------------------------------------------------------------------


def format_interval(months: int, days: int, usec: int) -> str:
    """PostgreSQL's interval output with IntervalStyle postgres (EncodeInterval)."""
    if months == 0x7FFFFFFF and days == 0x7FFFFFFF and usec == TS_PINF:
        return "infinity"
    if months == -0x80000000 and days == -0x80000000 and usec == TS_NINF:
        return "-infinity"
    parts: list[str] = []
    before = False  # the previous part was negative: a positive one then gets a '+'
    year, mon = int(months / 12), months - 12 * int(months / 12)  # C truncation
    for value, unit in ((year, "year"), (mon, "mon"), (days, "day")):
        if value:
            plus = "+" if before and value > 0 else ""
            parts.append(f"{plus}{value} {unit}{'' if value == 1 else 's'}")
            before = value < 0
    if not parts or usec:
        neg = usec < 0
        a = abs(usec)
        hour, rest = divmod(a, 3_600_000_000)
        minute, rest = divmod(rest, 60_000_000)
        sec, frac = divmod(rest, 1_000_000)
        sign = "-" if neg else ("+" if before else "")
        parts.append(f"{sign}{hour:02d}:{minute:02d}:{sec:02d}{_fraction(frac)}")
    return " ".join(parts)


_INTERVAL_PART = re.compile(
    r"([+-]?\d+) (years?|mons?|days?)|([+-])?(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?"
)


def parse_interval_text(text: str) -> tuple[int, int, int]:
    """(months, days, microseconds) of an interval in IntervalStyle postgres."""
    if text == "infinity":
        return 0x7FFFFFFF, 0x7FFFFFFF, TS_PINF
    if text == "-infinity":
        return -0x80000000, -0x80000000, TS_NINF
    months = days = usec = 0
    pos = 0
    for m in _INTERVAL_PART.finditer(text):
        if text[pos : m.start()].strip():
            break
        pos = m.end()
        num, unit, sign, hh, mi, ss, frac = m.groups()
        if unit:
            n = int(num)
            if unit.startswith("year"):
                months += 12 * n
            elif unit.startswith("mon"):
                months += n
            else:
                days += n
        else:
            t = ((int(hh) * 60 + int(mi)) * 60 + int(ss)) * 1_000_000
            t += int((frac or "0").ljust(6, "0"))
            usec += -t if sign == "-" else t
    if text[pos:].strip() or pos == 0:
        raise ValueError(f"not an interval in IntervalStyle postgres: {text!r}")
    return months, days, usec


# --- floats ----------------------------------------------------------------------------------
# PostgreSQL 12+ prints a float with Ryu (float8out: d2s, float4out: f2s) when
# extra_float_digits > 0, the default: the fewest digits strictly between the midpoints to the
# float's neighbours, the nearest to it when several. Strictly: PostgreSQL builds Ryu with
# STRICTLY_SHORTEST 0, so it never writes a decimal lying right on a midpoint, which a reader
# rounding half to even would read back. Python's repr does write those: 3.224506757900573e+16
# is 3.2245067579005728e+16 there.

_F4, _U4 = struct.Struct("!f"), struct.Struct("!I")
_F8, _U8 = struct.Struct("!d"), struct.Struct("!Q")
# Below 2**53 a double's midpoints have more than 17 digits, or a shorter decimal beside
# them (the integer itself), so repr never ends on one: its digits are float8out's.
REPR_EXACT = 2.0**53


def _compare(d: int, k: int, b: int, j: int) -> int:
    """The sign of d * 10**k - b * 2**j, in integers."""
    if k >= 0:
        d *= 10**k
    else:
        b *= 10**-k
    if j >= 0:
        b <<= j
    else:
        d <<= -j
    return (d > b) - (d < b)


def _decimal(text: str) -> tuple[int, int]:
    """``'1.25e-03'`` as (125, -5), that is 125 * 10**-5."""
    mant, _, exp = text.partition("e")
    whole, _, fraction = mant.partition(".")
    return int(whole + fraction), int(exp or 0) - len(fraction)


class _Binary:
    """A positive finite float32 or float64, m * 2**e, and the decimals that read back as it:
    those strictly between ``lo`` and ``hi``, the midpoints to its neighbours in units of
    2**(e-2). Below a power of two the neighbour is half as far (Ryu's mmShift)."""

    __slots__ = ("packed", "m", "e", "uneven", "lo", "hi")

    def __init__(self, x: float, float4: bool):
        fmt, word, width, subnormal_e = (_F4, _U4, 23, -149) if float4 else (_F8, _U8, 52, -1074)
        self.packed = fmt.pack(x)  # OverflowError past float32's range
        (bits,) = word.unpack(self.packed)
        biased, frac = bits >> width, bits & ((1 << width) - 1)
        if biased:
            self.m, self.e = frac | 1 << width, biased + subnormal_e - 1
        else:
            self.m, self.e = frac, subnormal_e
        self.uneven = frac == 0 and biased > 1
        self.lo, self.hi = 4 * self.m - (1 if self.uneven else 2), 4 * self.m + 2

    def inside(self, d: int, k: int) -> bool:
        j = self.e - 2
        return _compare(d, k, self.lo, j) > 0 and _compare(d, k, self.hi, j) < 0

    def around(self, text: str) -> str | None:
        """The nearest n-digit decimal ``text`` if it reads back, else the n-digit one on the
        value's other side if that one does (beside a midpoint or a power of two)."""
        d, k = _decimal(text)
        if self.inside(d, k):
            return text
        other = d - _compare(d, k, 4 * self.m, self.e - 2)
        return f"{other}e{k}" if self.inside(other, k) else None

    def shortest(self, quick: bool) -> str:
        """The shortest digits, as ``'d.ddde+XX'``. If n digits read back, so do n + 1 (the
        nearest n + 1 digits on either side are no farther than those n): search n by halves.
        """
        low, high, best = 1, 9 if quick else 17, None  # 9 or 17 digits always read back
        while low <= high:
            n = (low + high) // 2
            found = self.digits(n, quick)
            if found is None:
                low = n + 1
            else:
                best, high = found, n - 1
        if best is None:
            raise AssertionError(f"no digits read back as {self.m} * 2**{self.e}")
        return best

    def digits(self, n: int, quick: bool) -> str | None:
        """``n`` digits that read back, if any do. ``quick`` (float32): a decimal that reads
        as a double off the midpoints reads back as this float32 exactly when its double
        packs to it; only the others are checked in integers."""
        text = f"{math.ldexp(self.m, self.e):.{n - 1}e}"  # the nearest n digits
        if quick and not self.uneven:
            y = float(text)
            j = self.e - 2
            if y != math.ldexp(self.lo, j) and y != math.ldexp(self.hi, j):
                return text if _packs_to(y, self.packed) else None
        return self.around(text)


def _packs_to(y: float, packed: bytes) -> bool:
    try:
        return _F4.pack(y) == packed
    except OverflowError:
        return False


def _shortest(x: float, float4: bool) -> str:
    """The digits PostgreSQL prints for ``x`` (positive, finite; read as the float32 nearest
    it with ``float4``), as a decimal Python reads (``'1.5e-05'``, ``'100.0'``)."""
    if float4:
        return _Binary(x, True).shortest(quick=True)
    text = repr(x)  # the same unless it lies on a midpoint
    if x < REPR_EXACT:
        return text
    b = _Binary(x, False)
    return text if b.inside(*_decimal(text)) else b.shortest(quick=False)


def float4_shortest(x: float) -> float:
    """The float32 value ``x`` as the double of the decimal float4out prints for it, which is
    what a text slot's value loads as (so a binary float4 equals the same value from text)."""
    if x != x or x in (math.inf, -math.inf) or x == 0.0:
        return x
    return math.copysign(float(_shortest(abs(x), True)), x)


def pg_float_text(x: float, float4: bool = False) -> str:
    """PostgreSQL's float8out, or float4out with ``float4`` (``x`` read as the float32
    nearest it): shortest digits, in exponent form below 1e-4 or from 1e15 (1e6 for
    float4), ``NaN``, ``Infinity``, ``-0``."""
    if x != x:
        return "NaN"
    if x in (math.inf, -math.inf):
        return "Infinity" if x > 0 else "-Infinity"
    neg = "-" if math.copysign(1.0, x) < 0 else ""
    if x == 0:
        return neg + "0"
    d, k = _decimal(_shortest(abs(x), float4))
    whole = str(d)
    ds, e10 = whole.rstrip("0"), k + len(whole) - 1  # digits, exponent of the first one
    if e10 < -4 or e10 >= (6 if float4 else 15):
        mant = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
        return f"{neg}{mant}e{'-' if e10 < 0 else '+'}{abs(e10):02d}"
    if e10 < 0:
        return f"{neg}0.{'0' * (-e10 - 1)}{ds}"
    if len(ds) <= e10 + 1:
        return neg + ds + "0" * (e10 + 1 - len(ds))
    return f"{neg}{ds[: e10 + 1]}.{ds[e10 + 1 :]}"
