package pgcdc.jvm;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.api.java.UDF2;
import org.apache.spark.sql.catalyst.expressions.GenericRow;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * decode_messages on the JVM: (message bytes, context key) -> struct(message, decode_error).
 *
 * A generated subclass decodes one spec's messages (decodeMessage); this class applies one
 * decode_messages call's settings, which the Python side resolves and hands over before it
 * registers the function: the gate values (version, contexts...) or the error for each context
 * key (the per-message context columns' values, false/true/null as 0/1/2 in base 3), the hint
 * appended to every error, and FAILFAST.
 */
public abstract class MessageUdf implements UDF2<byte[], Integer, Row> {
    private static final long serialVersionUID = 1L;

    private int[][] gates = new int[0][];
    private String[] errors = new String[0];
    private String hint = "";
    private boolean failfast;

    /** The message struct's values (type name first), or a DecodeException. */
    protected abstract Object[] decodeMessage(WireReader r, int[] gates);

    public void setFailfast(boolean failfast) {
        this.failfast = failfast;
    }

    public void setHint(String hint) {
        this.hint = hint == null ? "" : hint;
    }

    /** The gate values for one context key, comma-separated. */
    public void setGates(int key, String values) {
        grow(key);
        String[] parts = values.split(",");
        int[] g = new int[parts.length];
        for (int i = 0; i < g.length; i++) g[i] = Integer.parseInt(parts[i].trim());
        gates[key] = g;
        errors[key] = null;
    }

    /** The error of every row with this context key (e.g. a null context column). */
    public void setError(int key, String reason) {
        grow(key);
        gates[key] = null;
        errors[key] = reason;
    }

    private void grow(int key) {
        if (key >= gates.length) {
            gates = java.util.Arrays.copyOf(gates, key + 1);
            String[] more = java.util.Arrays.copyOf(errors, key + 1);
            for (int k = errors.length; k <= key; k++) more[k] = "no gate values for context key " + k;
            errors = more;
        }
    }

    @Override
    public Row call(byte[] data, Integer key) {
        try {
            return new GenericRow(new Object[] {new GenericRow(decode(data, key)), null});
        } catch (DecodeException e) {
            return failed(e);
        } catch (RuntimeException e) { // PERMISSIVE never fails the job on bad bytes
            return failed(new DecodeException(0, "<message>", e.getClass().getSimpleName() + ": "
                    + e.getMessage()));
        }
    }

    private Object[] decode(byte[] data, Integer key) {
        int k = key == null ? -1 : key;
        if (k < 0 || k >= gates.length) {
            throw new DecodeException(0, "<message>", "no gate values for context key " + key);
        }
        if (errors[k] != null) throw new DecodeException(0, "<message>", errors[k]);
        if (data == null) throw new DecodeException(0, "<message>", "the data column is null");
        WireReader r = new WireReader(data);
        Object[] values = decodeMessage(r, gates[k]);
        DecodeException bad = r.badString();
        if (bad != null) throw bad;
        return values;
    }

    private Row failed(DecodeException e) {
        if (!hint.isEmpty()) e = e.withSuffix(hint);
        if (failfast) {
            // a JDK class: the driver deserializes the task's failure without our jar
            throw new IllegalArgumentException(e.withSuffix(" (decode_messages FAILFAST)").getMessage());
        }
        return new GenericRow(new Object[] {null, UTF8String.fromString(e.getMessage())});
    }
}
