package pgcdc.jvm;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.time.Instant;
import java.util.Arrays;

import org.apache.spark.sql.types.Decimal;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * One message being decoded: a bounds-checked big-endian reader over its bytes, the field path
 * of what is being read (for errors), and the conversions into Spark's values.
 *
 * Spec-independent: the generated decoder walks the fields, this class reads them. Every error
 * is worded as the Python codec words it (pgcdc.runtime.decoding), with the byte offset and the
 * path, so both Spark engines give the same decode_error text.
 */
public final class WireReader {
    /** PostgreSQL timestamps (micros since 2000-01-01) that Spark and Python both hold. */
    public static final long TS_MIN_US = -63_082_195_200_000_000L;
    public static final long TS_MAX_US = 252_455_443_200_000_000L;
    private static final long PG_EPOCH_OFFSET_US = 946_684_800_000_000L;
    private static final BigInteger TWO_64 = BigInteger.ONE.shiftLeft(64);

    public final byte[] d;
    public final int n;
    /** The offset of the next unread byte. */
    public int o;

    // the field path: names, or element indexes where idx >= 0
    private String[] names = new String[8];
    private int[] idx = new int[8];
    private int depth;

    // the first string (in wire order) that is not UTF-8; reported only if all else decodes
    private long badOffset = -1;
    private String badReason;
    private String badPath;

    public WireReader(byte[] d) {
        this.d = d;
        this.n = d.length;
    }

    // -- the field path -------------------------------------------------------------------
    public void push(String name) {
        grow();
        names[depth] = name;
        idx[depth++] = -1;
    }

    public void pushIndex(int i) {
        grow();
        names[depth] = null;
        idx[depth++] = i;
    }

    public void pop() {
        depth--;
    }

    private void grow() {
        if (depth == names.length) {
            names = Arrays.copyOf(names, depth * 2);
            idx = Arrays.copyOf(idx, depth * 2);
        }
    }

    /** The current path plus `last` (null: none), as format_path prints it. */
    public String path(String last) {
        StringBuilder out = new StringBuilder();
        for (int k = 0; k < depth; k++) {
            if (idx[k] >= 0) {
                out.append('[').append(idx[k]).append(']');
            } else {
                if (out.length() > 0) out.append('.');
                out.append(names[k]);
            }
        }
        if (last != null) {
            if (out.length() > 0) out.append('.');
            out.append(last);
        }
        return out.length() == 0 ? "<message>" : out.toString();
    }

    // -- errors (only built when something is wrong) ----------------------------------------
    public DecodeException error(long offset, String last, String reason) {
        return new DecodeException(offset, path(last), reason);
    }

    /** A fixed-width field does not fit: the first one of a run that is cut off. */
    public DecodeException truncated(int offset, String name, int size) {
        return error(offset, name, "message ends after " + n + " bytes; " + name + " needs " + size
                + " more from here");
    }

    public DecodeException shortBy(long offset, BigInteger need, String name) {
        return error(offset, name, "message ends after " + n + " bytes; " + need + " more needed here");
    }

    public DecodeException shortBy(long offset, long need, String name) {
        return shortBy(offset, BigInteger.valueOf(need), name);
    }

    /** What Python says when a count outgrows the list made for it (elements of no bytes). */
    public DecodeException listIndex() {
        return new DecodeException(0, "<message>", "IndexError: list assignment index out of range");
    }

    public DecodeException unterminated(int offset, String name) {
        return error(offset, name, "string has no NUL terminator before the end (" + n + " bytes)");
    }

    public DecodeException badLiteral(int offset, String name, int expected, int got) {
        return error(offset, name, "expected " + pyRepr(expected) + ", got " + pyRepr(got) + " (0x"
                + hex2(got) + ")");
    }

    public DecodeException badChoice(int offset, String name, int got, String allowed) {
        return error(offset, name, "unknown value " + pyRepr(got) + " (0x" + hex2(got)
                + "); expected one of " + allowed);
    }

    public DecodeException trailing() {
        return error(o, null, (n - o) + " unexpected trailing byte(s) after the message");
    }

    public DecodeException unknownTag(int tag) {
        return new DecodeException(0, "<message>", "unknown message tag " + pyRepr(tag) + " (0x"
                + hex2(tag) + ")");
    }

    public DecodeException needsVersion(String message, String versionName, int since, int version) {
        return new DecodeException(0, message, message + " needs " + versionName + " " + since
                + ", not " + version);
    }

    /** Python's repr() of chr(c) for a byte c: 'a', '\x00', '\n', "'", '\\', 'é'. */
    public static String pyRepr(int c) {
        switch (c) {
            case '\t': return "'\\t'";
            case '\n': return "'\\n'";
            case '\r': return "'\\r'";
            case '\\': return "'\\\\'";
            case '\'': return "\"'\"";
            default:
        }
        boolean printable = (c >= 0x20 && c < 0x7f) || (c > 0xa0 && c != 0xad);
        return printable ? "'" + (char) c + "'" : "'\\x" + hex2(c) + "'";
    }

    private static String hex2(int c) {
        String h = Integer.toHexString(c);
        return h.length() < 2 ? "0" + h : h;
    }

    // -- bounds -------------------------------------------------------------------------------
    /**
     * The end of `count` items of `size` bytes from offset o, or an error naming `name` when
     * they do not fit (count is unsigned).
     */
    public int runEnd(long count, int size, String name) {
        long left = n - o;
        if (count >= 0 && count <= left / size) return o + (int) (count * size);
        BigInteger need = unsigned(count).multiply(BigInteger.valueOf(size))
                .add(BigInteger.valueOf(o - (long) n));
        throw shortBy(o, need, name);
    }

    /** The offset of the NUL ending a string that starts at o, or -1. */
    public int nul() {
        for (int i = o; i < n; i++) {
            if (d[i] == 0) return i;
        }
        return -1;
    }

    /** How many elements to make room for: a count the bytes left cannot hold is capped. */
    public int capacity(long count) {
        long left = n - o;
        return (int) (count >= 0 && count <= left ? count : left);
    }

    private static BigInteger unsigned(long v) {
        BigInteger b = BigInteger.valueOf(v);
        return v < 0 ? b.add(TWO_64) : b;
    }

    // -- big-endian reads (the caller checked the bounds) -------------------------------------
    public int u8(int at) {
        return d[at] & 0xff;
    }

    public int u16(int at) {
        return ((d[at] & 0xff) << 8) | (d[at + 1] & 0xff);
    }

    public int i32(int at) {
        return ((d[at] & 0xff) << 24) | ((d[at + 1] & 0xff) << 16) | ((d[at + 2] & 0xff) << 8)
                | (d[at + 3] & 0xff);
    }

    public long u32(int at) {
        return i32(at) & 0xffffffffL;
    }

    public long i64(int at) {
        return ((long) i32(at) << 32) | (i32(at + 4) & 0xffffffffL);
    }

    // -- values as Spark holds them -----------------------------------------------------------
    /** A Byte1 field's table: the one-character string of each allowed byte, else null. */
    public static UTF8String[] choices(int... codes) {
        UTF8String[] table = new UTF8String[256];
        for (int c : codes) table[c] = UTF8String.fromString(String.valueOf((char) c));
        return table;
    }

    /** An unsigned 64-bit value as DecimalType(20, 0). */
    public static Decimal u64(long v) {
        if (v >= 0) return Decimal.apply(v);
        return Decimal.apply(new BigDecimal(unsigned(v)));
    }

    private static final byte[] HEX = "0123456789ABCDEF".getBytes();

    /** An LSN as PostgreSQL prints it: %X/%X of its high and low 32 bits. */
    public static UTF8String lsnText(long v) {
        byte[] out = new byte[17];
        int k = hex(out, 0, v >>> 32);
        out[k++] = '/';
        k = hex(out, k, v & 0xffffffffL);
        return UTF8String.fromBytes(out, 0, k);
    }

    private static int hex(byte[] out, int k, long v) {
        int shift = 28;
        while (shift > 0 && ((v >>> shift) & 0xf) == 0) shift -= 4;
        for (; shift >= 0; shift -= 4) out[k++] = HEX[(int) ((v >>> shift) & 0xf)];
        return k;
    }

    /** A PostgreSQL timestamp as Spark's TimestampType, null outside 0001-01-02 .. 9999-12-30. */
    public static Instant timestamp(long pgMicros) {
        if (pgMicros < TS_MIN_US || pgMicros > TS_MAX_US) return null;
        long us = pgMicros + PG_EPOCH_OFFSET_US;
        return Instant.ofEpochSecond(Math.floorDiv(us, 1_000_000L), Math.floorMod(us, 1_000_000L) * 1000L);
    }

    public byte[] bytes(int start, int end) {
        return Arrays.copyOfRange(d, start, end);
    }

    /**
     * The string in d[start, end) as Spark holds it. One that is not UTF-8 is remembered (the
     * first one only) with its offset and Python's reason, under the path plus `last`.
     */
    public UTF8String string(int start, int end, String last) {
        int bad = -1;
        for (int i = start; i < end; i++) {
            if (d[i] < 0) {
                bad = i;
                break;
            }
        }
        if (bad >= 0 && badOffset < 0) {
            String reason = utf8Error(d, bad, end);
            if (reason != null) {
                badOffset = utf8ErrorAt;
                badReason = reason;
                badPath = path(last);
            }
        }
        return UTF8String.fromBytes(d, start, end - start);
    }

    /** The error for the first string that is not UTF-8, if any (after the rest decoded). */
    public DecodeException badString() {
        if (badOffset < 0) return null;
        return new DecodeException(badOffset, badPath, "string is not valid UTF-8 (" + badReason
                + "), which Spark's StringType cannot hold");
    }

    private int utf8ErrorAt;

    private static boolean cont(int b) {
        return (b & 0xc0) == 0x80;
    }

    /**
     * Validate d[from, end) as CPython's strict UTF-8 decoder does: null when valid, else its
     * reason, with the offending sequence's start in utf8ErrorAt.
     */
    private String utf8Error(byte[] d, int from, int end) {
        int s = from;
        while (s < end) {
            int ch = d[s] & 0xff;
            utf8ErrorAt = s;
            if (ch < 0x80) {
                s++;
                continue;
            }
            int left = end - s;
            if (ch < 0xc2) return "invalid start byte";
            if (ch < 0xe0) {
                if (left < 2) return "unexpected end of data";
                if (!cont(d[s + 1] & 0xff)) return "invalid continuation byte";
                s += 2;
                continue;
            }
            if (ch < 0xf0) {
                if (left < 2) return "unexpected end of data";
                int ch2 = d[s + 1] & 0xff;
                if (!cont(ch2) || (ch2 < 0xa0 ? ch == 0xe0 : ch == 0xed)) {
                    return "invalid continuation byte";
                }
                if (left < 3) return "unexpected end of data";
                if (!cont(d[s + 2] & 0xff)) return "invalid continuation byte";
                s += 3;
                continue;
            }
            if (ch < 0xf5) {
                if (left < 2) return "unexpected end of data";
                int ch2 = d[s + 1] & 0xff;
                if (!cont(ch2) || (ch2 < 0x90 ? ch == 0xf0 : ch == 0xf4)) {
                    return "invalid continuation byte";
                }
                if (left < 3) return "unexpected end of data";
                if (!cont(d[s + 2] & 0xff)) return "invalid continuation byte";
                if (left < 4) return "unexpected end of data";
                if (!cont(d[s + 3] & 0xff)) return "invalid continuation byte";
                s += 4;
                continue;
            }
            return "invalid start byte";
        }
        return null;
    }
}
