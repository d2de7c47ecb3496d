package pgcdc.jvm;

/**
 * A message that breaks its format: the byte offset, the field path (as Python's
 * pgcdc.runtime.errors.format_path prints it) and the reason, worded like the Python codec's
 * DecodeError so that both engines give the same decode_error text.
 */
public final class DecodeException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public final long offset;
    public final String path;
    public final String reason;

    public DecodeException(long offset, String path, String reason) {
        super("cannot decode at byte " + offset + " in " + path + ": " + reason, null, false, false);
        this.offset = offset;
        this.path = path;
        this.reason = reason;
    }

    /** The same error with more words after the reason (a hint, the FAILFAST note). */
    public DecodeException withSuffix(String suffix) {
        return new DecodeException(offset, path, reason + suffix);
    }
}
