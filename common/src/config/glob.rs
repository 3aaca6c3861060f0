//! Glob matching for event types: `*` matches any run of characters (including dots), every other
//! character matches itself. `message.*` matches `message.created`; `*` matches everything.

/// True if `text` matches `pattern`. Iterative, O(len(pattern) * len(text)) worst case, no
/// allocation, no recursion (patterns come from config, text from untrusted events).
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p = pattern.as_bytes();
    let t = text.as_bytes();
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<usize> = None;
    let mut star_t = 0usize;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some(pi);
            pi += 1;
            star_t = ti;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            star_t += 1;
            ti = star_t;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    #[test]
    fn matches() {
        assert!(glob_match("*", "anything.at.all"));
        assert!(glob_match("message.*", "message.created"));
        assert!(!glob_match("message.*", "messages.created"));
        assert!(glob_match("call.*.ended", "call.inbound.ended"));
        assert!(glob_match("exact", "exact"));
        assert!(!glob_match("exact", "exactly"));
        assert!(glob_match("*.failed", "payment.charge.failed"));
        assert!(!glob_match("a*b", "acd"));
        assert!(glob_match("", ""));
        assert!(!glob_match("", "x"));
    }
}
