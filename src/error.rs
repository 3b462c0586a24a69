//! Typed errors of the library. Each reads well after "error: "; which
//! exit code each ends with is decided in `commands/exits.rs`.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A scenario file that cannot be used; the message names file, line and column.
    #[error("{0}")]
    Scenario(String),

    /// A flag or argument that makes no sense.
    #[error("{0}")]
    Usage(String),

    #[error("cannot reach PostgreSQL at {endpoint}: {cause}; start it with `scripts/services.sh up` (or `docker compose up -d --wait`), or fix DATABASE_URL")]
    DatabaseUnreachable { endpoint: String, cause: String },

    #[error("cannot reach Kafka at {brokers}: {cause}; start it with `scripts/services.sh up` (or `docker compose up -d --wait`), or fix KAFKA_BROKERS")]
    KafkaUnreachable { brokers: String, cause: String },

    #[error("database error while {context}: {cause}")]
    Database { context: String, cause: String },

    #[error("kafka error while {context}: {cause}")]
    Kafka { context: String, cause: String },

    #[error("cannot read report {path}: {cause}")]
    ReportRead { path: PathBuf, cause: String },

    #[error("cannot write {path}: {cause}")]
    Write { path: PathBuf, cause: String },

    /// A tool the command needs is missing or failed (pgbench for the bench).
    #[error("{0}")]
    Tool(String),

    #[error("internal error: {0}")]
    Internal(String),

    /// A call to the email provider that failed or timed out: the caller
    /// rolls back and tries again with the same idempotency key.
    #[error("the email provider: {0}")]
    Provider(String),

    /// A declared system's service that never became ready: its health
    /// URL did not answer 2xx in time.
    #[error("{0}")]
    Service(String),
}

impl Error {
    /// Wraps a sqlx error with what we were doing, with any password removed.
    pub fn db(context: impl Into<String>, err: sqlx::Error) -> Self {
        Error::Database { context: context.into(), cause: redact(&err.to_string()) }
    }

    /// A file or folder the run could not create or write.
    pub fn io(path: &std::path::Path, err: std::io::Error) -> Self {
        Error::Write { path: path.to_path_buf(), cause: err.to_string() }
    }

    pub fn kafka(context: impl Into<String>, err: impl std::fmt::Display) -> Self {
        Error::Kafka { context: context.into(), cause: err.to_string() }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Removes the password from anything that may contain a URL.
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let end = tail.find(|c: char| c.is_whitespace() || c == '/' || c == '"' || c == '\'').unwrap_or(tail.len());
        let authority = &tail[..end];
        match (authority.rfind('@'), authority.find(':')) {
            (Some(at), Some(colon)) if colon < at => {
                out.push_str(&authority[..colon]);
                out.push_str(":***");
                out.push_str(&authority[at..]);
            }
            _ => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// `host:port/database` of a PostgreSQL url, for messages.
pub fn db_endpoint(url: &str) -> String {
    let r = redact(url);
    let after = r.split("://").nth(1).unwrap_or(&r);
    let after = after.rsplit('@').next().unwrap_or(after);
    after.split('?').next().unwrap_or(after).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords_only() {
        assert_eq!(redact("postgres://chaos:s3cret@127.0.0.1:5432/db"), "postgres://chaos:***@127.0.0.1:5432/db");
        assert_eq!(redact("error at postgres://u@h/db ok"), "error at postgres://u@h/db ok");
        assert_eq!(
            redact("x postgres://a:b@h/d and postgres://c:d@h2/e"),
            "x postgres://a:***@h/d and postgres://c:***@h2/e"
        );
        assert_eq!(db_endpoint("postgres://chaos:pw@127.0.0.1:5432/chaos?sslmode=disable"), "127.0.0.1:5432/chaos");
    }
}
