import java.net.URI;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.HexFormat;
import java.util.List;
import java.util.Properties;
import java.util.UUID;

/**
 * Writes outbox rows from Java with plain JDBC, by the SQL contract (docs/sql-contract.md):
 * PostgreSQL (pgJDBC) or, with a mysql:// URL, MySQL/MariaDB (MariaDB Connector/J, section 8 of
 * the contract). Each transaction credits an account: the account's next ledger entry (the business write) and
 * its {@code account.credited} event (the outbox row) commit together, or neither does.
 */
public final class Producer {
    static final String SCHEMA = env("OUTBOX_SCHEMA", "public"); // the schema given to `outbox migrate`
    static final List<String> ACCOUNTS = List.of("acct-1", "acct-2", "acct-3", "acct-4", "acct-5"); // shared
    static final SecureRandom RANDOM = new SecureRandom();
    static final URI URL = URI.create(env("DATABASE_URL", "postgres://root@127.0.0.1:5432/test"));
    static final boolean MYSQL = List.of("mysql", "mariadb").contains(URL.getScheme());

    record Credit(String messageId, long entryNo, String traceparent, boolean committed) {}

    /** All the SQL of one credit, inside the caller's transaction. */
    static Credit writeCredit(Connection tx, String accountId, long amountCents, int n, String traceparent)
            throws SQLException {
        // 1. The per-key lock of the contract (section 2 b), the same one every writer of this key
        //    takes. It comes first because the entry number below is read under it too.
        try (PreparedStatement ps = tx.prepareStatement(
                "SELECT pg_advisory_xact_lock(hashtext('outbox:' || ?), hashtext(?))")) {
            ps.setString(1, SCHEMA);
            ps.setString(2, accountId);
            ps.execute();
        }
        // 2. The business write: the account's next ledger entry.
        long entryNo;
        try (PreparedStatement ps = tx.prepareStatement(
                "INSERT INTO ledger (account_id, entry_no, amount_cents, producer)"
                        + " SELECT ?, coalesce(max(entry_no), 0) + 1, ?, 'java'"
                        + " FROM ledger WHERE account_id = ? RETURNING entry_no")) {
            ps.setString(1, accountId);
            ps.setLong(2, amountCents);
            ps.setString(3, accountId);
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                entryNo = rs.getLong(1);
            }
        }
        // 3. The outbox row, in the same transaction: JSON as text, cast in SQL. Real code builds
        //    it with its JSON library (Jackson, Gson, ...); these values need no escaping.
        String payload = String.format(
                "{\"account_id\":\"%s\",\"entry_no\":%d,\"amount_cents\":%d,\"producer\":\"java\",\"n\":%d}",
                accountId, entryNo, amountCents, n);
        String headers = String.format("{\"traceparent\":\"%s\"}", traceparent);
        try (PreparedStatement ps = tx.prepareStatement(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)"
                        + " VALUES (?, ?, ?, ?::jsonb, ?::jsonb) RETURNING id")) {
            ps.setString(1, "account");
            ps.setString(2, accountId);
            ps.setString(3, "account.credited");
            ps.setString(4, payload);
            ps.setString(5, headers);
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                return new Credit(rs.getString(1), entryNo, traceparent, false);
            }
        }
    }

    /**
     * The same credit on MySQL/MariaDB. The outbox table's trigger gives the row its key's position
     * and keeps it until commit, so no lock is taken for the outbox; the outbox row goes last (the
     * contract, section 8), and the message id is made here (no RETURNING on MySQL).
     */
    static Credit writeCreditMysql(Connection tx, String accountId, long amountCents, int n, String traceparent)
            throws SQLException {
        // 1. The business write: the account's row, locked until commit, gives the number.
        try (PreparedStatement ps = tx.prepareStatement(
                "UPDATE ledger_accounts SET last_entry = last_entry + 1 WHERE account_id = ?")) {
            ps.setString(1, accountId);
            if (ps.executeUpdate() != 1) {
                throw new SQLException("no account " + accountId);
            }
        }
        long entryNo;
        try (PreparedStatement ps = tx.prepareStatement(
                "SELECT last_entry FROM ledger_accounts WHERE account_id = ?")) {
            ps.setString(1, accountId);
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                entryNo = rs.getLong(1);
            }
        }
        try (PreparedStatement ps = tx.prepareStatement(
                "INSERT INTO ledger (account_id, entry_no, amount_cents, producer) VALUES (?, ?, ?, 'java')")) {
            ps.setString(1, accountId);
            ps.setLong(2, entryNo);
            ps.setLong(3, amountCents);
            ps.executeUpdate();
        }
        // 2. The outbox row, last: JSON as text into the JSON columns.
        String id = UUID.randomUUID().toString();
        String payload = String.format(
                "{\"account_id\":\"%s\",\"entry_no\":%d,\"amount_cents\":%d,\"producer\":\"java\",\"n\":%d}",
                accountId, entryNo, amountCents, n);
        try (PreparedStatement ps = tx.prepareStatement(
                "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)"
                        + " VALUES (?, ?, ?, ?, ?, ?)")) {
            ps.setString(1, id);
            ps.setString(2, "account");
            ps.setString(3, accountId);
            ps.setString(4, "account.credited");
            ps.setString(5, payload);
            ps.setString(6, String.format("{\"traceparent\":\"%s\"}", traceparent));
            ps.executeUpdate();
        }
        return new Credit(id, entryNo, traceparent, false);
    }

    /** The service method: one transaction. A dry run does every write, then rolls them back. */
    static Credit creditAccount(Connection c, String accountId, long amountCents, int n, boolean dryRun)
            throws SQLException {
        String traceparent = "00-" + hex(16) + "-" + hex(8) + "-01";
        try {
            Credit written = MYSQL
                    ? writeCreditMysql(c, accountId, amountCents, n, traceparent)
                    : writeCredit(c, accountId, amountCents, n, traceparent);
            if (dryRun) {
                c.rollback(); // no ledger entry, no outbox row: the event never exists
            } else {
                c.commit();
            }
            return new Credit(written.messageId(), written.entryNo(), traceparent, !dryRun);
        } catch (SQLException | RuntimeException e) {
            c.rollback();
            throw e;
        }
    }

    public static void main(String[] args) throws SQLException {
        // The same postgres://user[:password]@host[:port]/db URL as the other examples (or
        // mysql://..., whose database holds the outbox and the ledger).
        URI url = URL;
        Properties props = new Properties();
        if (url.getRawUserInfo() != null) {
            String[] userInfo = url.getRawUserInfo().split(":", 2);
            props.setProperty("user", URLDecoder.decode(userInfo[0], StandardCharsets.UTF_8));
            if (userInfo.length == 2) {
                props.setProperty("password", URLDecoder.decode(userInfo[1], StandardCharsets.UTF_8));
            }
        }
        String jdbcUrl;
        if (MYSQL) {
            jdbcUrl = "jdbc:mariadb://" + url.getHost() + ":" + (url.getPort() < 0 ? 3306 : url.getPort())
                    + url.getPath();
        } else {
            props.setProperty("currentSchema", SCHEMA); // the search_path: unqualified `outbox` and `ledger`
            jdbcUrl = "jdbc:postgresql://" + url.getHost() + ":" + (url.getPort() < 0 ? 5432 : url.getPort())
                    + url.getPath();
        }
        int transactions = Integer.parseInt(env("TRANSACTIONS", "200"));

        try (Connection c = DriverManager.getConnection(jdbcUrl, props)) {
            c.setAutoCommit(false); // every statement runs in a transaction until commit() or rollback()
            for (int n = 1; n <= transactions; n++) {
                String accountId = ACCOUNTS.get(n % ACCOUNTS.size());
                // Every 13th credit is a dry run, rolled back on purpose.
                Credit credit = creditAccount(c, accountId, 100 + n, n, n % 13 == 0);
                // One line per transaction, read by scripts/examples.sh.
                System.out.println((credit.committed() ? "committed" : "rolled_back") + " java " + n + " "
                        + credit.messageId() + " " + accountId + " " + credit.entryNo() + " " + credit.traceparent());
            }
        }
    }

    static String hex(int bytes) {
        byte[] b = new byte[bytes];
        RANDOM.nextBytes(b);
        return HexFormat.of().formatHex(b);
    }

    static String env(String name, String fallback) {
        String value = System.getenv(name);
        return value == null || value.isEmpty() ? fallback : value;
    }
}
