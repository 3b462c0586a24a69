//! Typed errors of the library. Each variant knows its exit code and reads well
//! after "error: ".

use crate::exit::Exit;
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
}

impl Error {
    pub fn exit(&self) -> Exit {
        match self {
            Error::Scenario(_) | Error::Usage(_) | Error::ReportRead { .. } => Exit::BadInput,
            Error::DatabaseUnreachable { .. }
            | Error::KafkaUnreachable { .. }
            | Error::Database { .. }
            | Error::Kafka { .. }
            | Error::Tool(_) => Exit::Infra,
            Error::Write { .. } => Exit::Io,
            Error::Internal(_) => Exit::Internal,
        }
    }

    /// Wraps a sqlx error with what we were doing, with any password removed.
    pub fn db(context: impl Into<String>, err: sqlx::Error) -> Self {
        Error::Database { context: context.into(), cause: crate::harness::infra::redact(&err.to_string()) }
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
