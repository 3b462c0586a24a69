//! `chaos_text(x)`: a value as text, alike on both backends, for the SQL
//! a declaration writes (docs/contract.md section 8). On PostgreSQL it is
//! `x::text`. On SQLite, which stores our uuids as 16-byte BLOBs and whose
//! `CAST(x AS TEXT)` gives their raw bytes, it writes a 16-byte BLOB as the
//! uuid PostgreSQL would print, and anything else as SQLite's own text. So
//! one declaration of the payments pipeline judges it on both, and the
//! outbox log holds the same text on both.

use libsqlite3_sys as ffi;
use std::os::raw::{c_char, c_int};

/// The PostgreSQL function, created in the run's schema beside the
/// outbox log.
pub const POSTGRES: &str =
    "CREATE OR REPLACE FUNCTION chaos_text(anyelement) RETURNS text LANGUAGE sql IMMUTABLE AS 'SELECT $1::text'";

/// The text of one SQLite value: a uuid for a 16-byte BLOB, lowercase hex
/// for any other BLOB, SQLite's own text for the rest; NULL stays NULL.
fn of_sqlite(value: *mut ffi::sqlite3_value) -> Option<String> {
    // SAFETY: `value` is the argument SQLite handed the function, valid for
    // the call; the blob and text pointers are read before any other call
    // on it, for the length SQLite reports.
    unsafe {
        match ffi::sqlite3_value_type(value) {
            ffi::SQLITE_NULL => None,
            ffi::SQLITE_BLOB => {
                let n = ffi::sqlite3_value_bytes(value) as usize;
                let p = ffi::sqlite3_value_blob(value) as *const u8;
                let bytes = if n == 0 || p.is_null() { &[][..] } else { std::slice::from_raw_parts(p, n) };
                Some(match uuid::Uuid::from_slice(bytes) {
                    Ok(u) => u.to_string(),
                    Err(_) => bytes.iter().map(|b| format!("{b:02x}")).collect(),
                })
            }
            _ => {
                let p = ffi::sqlite3_value_text(value);
                let n = ffi::sqlite3_value_bytes(value) as usize;
                let bytes = if p.is_null() { &[][..] } else { std::slice::from_raw_parts(p, n) };
                Some(String::from_utf8_lossy(bytes).into_owned())
            }
        }
    }
}

unsafe extern "C" fn chaos_text(ctx: *mut ffi::sqlite3_context, argc: c_int, argv: *mut *mut ffi::sqlite3_value) {
    if argc != 1 {
        ffi::sqlite3_result_error(ctx, c"chaos_text takes one argument".as_ptr(), -1);
        return;
    }
    match of_sqlite(*argv) {
        None => ffi::sqlite3_result_null(ctx),
        Some(s) => ffi::sqlite3_result_text(
            ctx,
            s.as_ptr() as *const c_char,
            s.len() as c_int,
            // SQLITE_TRANSIENT: SQLite copies the text before `s` drops.
            ffi::SQLITE_TRANSIENT(),
        ),
    }
}

/// Registers `chaos_text` on one SQLite connection (every connection the
/// store opens, so that the outbox log's trigger finds it whichever
/// connection inserts).
pub async fn register(conn: &mut sqlx::SqliteConnection) -> Result<(), sqlx::Error> {
    let mut handle = conn.lock_handle().await?;
    let db = handle.as_raw_handle().as_ptr();
    // SAFETY: `db` is this connection's handle, locked for the call; the
    // name is a C string literal; no user data, no destructor.
    let code = unsafe {
        ffi::sqlite3_create_function_v2(
            db,
            c"chaos_text".as_ptr(),
            1,
            ffi::SQLITE_UTF8 | ffi::SQLITE_DETERMINISTIC,
            std::ptr::null_mut(),
            Some(chaos_text),
            None,
            None,
            None,
        )
    };
    match code {
        ffi::SQLITE_OK => Ok(()),
        c => Err(sqlx::Error::Protocol(format!("registering chaos_text on SQLite failed with code {c}"))),
    }
}
