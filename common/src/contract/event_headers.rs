//! The event headers: the facts of a validated envelope that stage A writes on every record it
//! forwards (`<p>.dedupe`, then `<p>.dispatch`), so later stages need not re-parse the event.
//! Written and read through [`EventHeaders`] only.
//!
//! | header | |
//! |---|---|
//! | `hookline-event-id` | the envelope `id` |
//! | `hookline-event-type` | the envelope `type` |
//! | `hookline-tenant` | the envelope `tenant`, when set |
//! | `hookline-dedupe-key` | the namespaced dedupe key (stage B's seen-set key) |

use rdkafka::message::{Headers, Message};

use crate::contract::headers as h;

/// The envelope facts in a record's headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventHeaders {
    pub id: String,
    pub event_type: String,
    pub tenant: Option<String>,
    pub dedupe_key: Option<String>,
}

impl EventHeaders {
    /// `(name, value)` pairs to append to a record's headers.
    pub fn pairs(&self) -> Vec<(&'static str, &[u8])> {
        let mut out = vec![
            (h::EVENT_ID, self.id.as_bytes()),
            (h::EVENT_TYPE, self.event_type.as_bytes()),
        ];
        if let Some(key) = &self.dedupe_key {
            out.push((h::DEDUPE_KEY, key.as_bytes()));
        }
        if let Some(tenant) = &self.tenant {
            out.push((h::TENANT, tenant.as_bytes()));
        }
        out
    }

    /// Reads them from a record: id and type are required and non-empty, every one must be
    /// UTF-8; the error names what is wrong.
    pub fn from_message<M: Message>(msg: &M) -> Result<EventHeaders, &'static str> {
        let (mut id, mut event_type, mut tenant, mut dedupe_key) = (None, None, None, None);
        if let Some(headers) = msg.headers() {
            for header in headers.iter() {
                let slot = match header.key {
                    h::EVENT_ID => &mut id,
                    h::EVENT_TYPE => &mut event_type,
                    h::TENANT => &mut tenant,
                    h::DEDUPE_KEY => &mut dedupe_key,
                    _ => continue,
                };
                *slot = match header.value.map(std::str::from_utf8) {
                    Some(Ok(s)) => Some(s.to_string()),
                    Some(Err(_)) => return Err("a hookline header is not UTF-8"),
                    None => None,
                };
            }
        }
        let id = id
            .filter(|s| !s.is_empty())
            .ok_or("missing hookline-event-id header")?;
        let event_type = event_type
            .filter(|s| !s.is_empty())
            .ok_or("missing hookline-event-type header")?;
        Ok(EventHeaders {
            id,
            event_type,
            tenant,
            dedupe_key,
        })
    }

    /// Stage B's seen-set key of a record: its dedupe key, else `id:<event id>`; `None` when it
    /// has neither (not written by stage A: never dropped as a duplicate).
    pub fn seen_key<M: Message>(msg: &M) -> Option<String> {
        h::get(msg, h::DEDUPE_KEY)
            .map(str::to_string)
            .or_else(|| h::get(msg, h::EVENT_ID).map(|id| format!("id:{id}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::produce::owned_headers;
    use rdkafka::message::OwnedMessage;
    use rdkafka::Timestamp;

    fn message(pairs: Vec<(&str, Option<&[u8]>)>) -> OwnedMessage {
        OwnedMessage::new(
            Some(b"{}".to_vec()),
            None,
            "t".into(),
            Timestamp::NotAvailable,
            0,
            0,
            Some(owned_headers(pairs)),
        )
    }

    #[test]
    fn written_and_read_back() {
        let written = EventHeaders {
            id: "evt_1".into(),
            event_type: "message.created".into(),
            tenant: Some("acme".into()),
            dedupe_key: Some("id:acme:evt_1".into()),
        };
        let pairs = written
            .pairs()
            .into_iter()
            .map(|(k, v)| (k, Some(v)))
            .collect();
        let msg = message(pairs);
        assert_eq!(EventHeaders::from_message(&msg), Ok(written));
        assert_eq!(
            EventHeaders::seen_key(&msg).as_deref(),
            Some("id:acme:evt_1")
        );
    }

    #[test]
    fn what_is_missing_is_named() {
        let msg = message(vec![(h::EVENT_TYPE, Some(b"t".as_slice()))]);
        assert_eq!(
            EventHeaders::from_message(&msg),
            Err("missing hookline-event-id header")
        );
        assert_eq!(EventHeaders::seen_key(&msg), None);
        let msg = message(vec![(h::EVENT_ID, Some(b"e".as_slice()))]);
        assert_eq!(EventHeaders::seen_key(&msg).as_deref(), Some("id:e"));
        let msg = message(vec![(h::EVENT_ID, Some(b"\xff".as_slice()))]);
        assert_eq!(
            EventHeaders::from_message(&msg),
            Err("a hookline header is not UTF-8")
        );
    }
}
