//! What an operator (through the gateway) or the registry asks of the task that follows etcd
//! ([`super::follow`]): a message on a channel, so that the task stays the only owner of its
//! state and applies a command between two watch responses, never in the middle of one.

use tokio::sync::oneshot;

use crate::error::OpError;
use crate::model::SubscriptionKey;

/// What an operator (or the registry) asks of the follower.
pub enum Command {
    /// Write every held registration back into etcd.
    Reupload(oneshot::Sender<Result<Reuploaded, OpError>>),
    /// Stop every held registration: etcd's listing is what the operator meant.
    Accept(oneshot::Sender<Vec<String>>),
    /// The registry stopped this registration itself; it is no longer held.
    Forget(SubscriptionKey),
}

/// The outcome of writing the held registrations back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reuploaded {
    /// Service keys etcd holds again (created, or already there with the same configuration).
    pub reuploaded: Vec<String>,
    /// Service keys etcd refused, with its answer (e.g. another registration claims the
    /// endpoint meanwhile); they stay held.
    pub refused: Vec<(String, String)>,
}
