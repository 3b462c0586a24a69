//! The notifier's handlers, each with its own inbox claim, by the names the
//! inbox table stores. Which event types feed which handler is said twice,
//! on purpose: by the reference notifier (`pipeline::inbox::routes`), and by
//! the verifier's specification (`verifier::spec`), which never reads the
//! code it judges. A unit test holds the two equal.

choices! {
    /// The handlers of the notifier, each with its own inbox claim.
    Handler {
        /// The payment's status in the read model.
        Projection = "projection",
        /// One receipt per captured payment.
        Receipts = "receipts",
        /// Loyalty points += amount per captured payment.
        Loyalty = "loyalty",
    }
}

impl Handler {
    /// One bit per handler, for compact sets of them.
    pub fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// The handlers' names as the inbox table stores them.
pub const HANDLER_PROJECTION: &str = "projection";
pub const HANDLER_RECEIPTS: &str = "receipts";
pub const HANDLER_LOYALTY: &str = "loyalty";
pub const HANDLERS: [&str; 3] = [HANDLER_PROJECTION, HANDLER_RECEIPTS, HANDLER_LOYALTY];
