//! The source's position as the contexts it fed should record it, without any I/O.
//!
//! A context records a source's watermark when a batch of the source brings it ops. A context
//! the source no longer stores into would keep an old watermark, and a restart would resume the
//! source from a batch its publisher may no longer buffer. So the subscription remembers the last
//! batch it consumed and which mark each fed context was last sent, and before every checkpoint
//! round sends the lagging ones the current mark (see `actor::PushMarks`).

use std::collections::HashMap;

use crate::index::Watermark;
use crate::model::ContextKey;

#[derive(Debug, Default)]
pub struct SourceMarks {
    /// The last batch consumed: every op of it and of the batches before it is in the mailbox
    /// of the context it goes to (or was ignored). `None` before the first batch of a stream.
    consumed: Option<Watermark>,
    /// Per fed context, the seq of the last mark it was sent (with ops or on its own).
    sent: HashMap<ContextKey, u64>,
}

impl SourceMarks {
    /// Resuming after a restart at `resume` (the position recovered from disk), if any.
    pub fn new(resume: Option<Watermark>) -> Self {
        SourceMarks {
            consumed: resume,
            sent: HashMap::new(),
        }
    }

    /// The last batch consumed, if any: the source's position.
    pub fn position(&self) -> Option<Watermark> {
        self.consumed
    }

    /// A batch was consumed (applied, or undecodable: the position moves all the same).
    pub fn consumed(&mut self, mark: Watermark) {
        self.consumed = Some(mark);
    }

    /// A context was sent ops of the batch with seq `seq`.
    pub fn sent(&mut self, context: &ContextKey, seq: u64) {
        match self.sent.get_mut(context) {
            Some(s) => *s = seq,
            None => {
                self.sent.insert(context.clone(), seq);
            }
        }
    }

    /// The source was dropped: every context forgot its position, and what was consumed before
    /// belongs to a stream that is gone (a mark of it must not make a context skip the new one).
    pub fn dropped(&mut self) {
        self.consumed = None;
        self.sent.clear();
    }

    /// The contexts among `fed` that were not sent the current mark, with that mark; each is
    /// taken as sent.
    pub fn due<'a>(
        &mut self,
        fed: impl IntoIterator<Item = &'a ContextKey>,
    ) -> Vec<(ContextKey, Watermark)> {
        let Some(mark) = self.consumed else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for key in fed {
            if self.sent.get(key) != Some(&mark.seq) {
                self.sent(key, mark.seq);
                out.push((key.clone(), mark));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(lora: &str) -> ContextKey {
        ContextKey::new("", "m", lora, 16)
    }

    fn mark(seq: u64) -> Watermark {
        Watermark { seq, digest: seq }
    }

    #[test]
    fn only_contexts_behind_the_last_consumed_batch_are_due() {
        let mut marks = SourceMarks::new(None);
        let fed = [ctx(""), ctx("ad")];
        assert!(marks.due(&fed).is_empty(), "nothing consumed yet");
        marks.consumed(mark(1));
        marks.sent(&fed[0], 1);
        marks.sent(&fed[1], 1);
        marks.consumed(mark(2));
        marks.sent(&fed[0], 2);
        assert_eq!(marks.due(&fed), [(ctx("ad"), mark(2))]);
        assert!(marks.due(&fed).is_empty(), "sent once");
    }

    #[test]
    fn a_recovered_position_is_pushed_and_a_drop_forgets_it() {
        let mut marks = SourceMarks::new(Some(mark(7)));
        let fed = [ctx("")];
        assert_eq!(marks.due(&fed), [(ctx(""), mark(7))]);
        // The publisher turned out to be another process: its new stream starts over, and the
        // old position must not make the context skip it.
        marks.dropped();
        assert!(marks.due(&fed).is_empty());
        marks.consumed(mark(0));
        assert_eq!(marks.due(&fed), [(ctx(""), mark(0))]);
    }
}
