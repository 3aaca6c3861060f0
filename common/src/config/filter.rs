//! `filter` on an endpoint: a [CEL](https://cel.dev) expression over the event (`id`, `type`,
//! `tenant`, `data`) that must be true for the endpoint to receive it. Compiled at load, like the
//! URL and the secrets, so a bad one fails the load (and the API's write) naming the field and
//! the position; evaluated by the delivery path (`hookline_delivery::filter`).

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer};

/// The longest filter accepted, in bytes.
pub const FILTER_MAX_BYTES: usize = 4096;

/// The deepest expression tree accepted: evaluation recurses once per level, on the delivery
/// path's ordinary threads.
pub const FILTER_MAX_DEPTH: usize = 64;

/// The most macros (`exists`, `all`, `exists_one`, `map`, `filter`) a filter may use: each walks
/// a list of the event once.
pub const FILTER_MAX_MACROS: usize = 4;

/// The most `+` a filter may use: concatenating the event's strings or lists costs their size.
pub const FILTER_MAX_PLUS: usize = 16;

/// The stack compiling runs on: the parser recurses deeply before its own nesting guard (96)
/// stops hostile input, more than a 2 MiB thread has in a debug build.
const COMPILE_STACK: usize = 64 << 20;

/// The variables a filter may use: the event's fields.
pub const FILTER_VARIABLES: [&str; 4] = ["id", "type", "tenant", "data"];

/// A compiled filter and its source. Equal when the sources are.
#[derive(Clone)]
pub struct EventFilter {
    source: String,
    program: Arc<cel::Program>,
    /// Whether it reads `data` (else the body is never parsed for it).
    uses_data: bool,
}

impl EventFilter {
    /// Compiles `source`; the error names the line and column and what is wrong.
    pub fn compile(source: &str) -> Result<EventFilter, String> {
        if source.trim().is_empty() {
            return Err("must not be empty (omit it to receive every matching event)".into());
        }
        if source.len() > FILTER_MAX_BYTES {
            return Err(format!(
                "is {} bytes; at most {FILTER_MAX_BYTES}",
                source.len()
            ));
        }
        let program = std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("cel-compile".into())
                .stack_size(COMPILE_STACK)
                .spawn_scoped(scope, || {
                    let program =
                        cel::Program::compile(source).map_err(|e| describe_parse_errors(&e))?;
                    let depth = depth(program.expression());
                    if depth > FILTER_MAX_DEPTH {
                        // Dropped here, on the big stack (dropping a tree recurses too).
                        return Err(format!(
                            "nests {depth} levels deep; at most {FILTER_MAX_DEPTH}"
                        ));
                    }
                    bounded_cost(program.expression())?;
                    Ok(program)
                })
                .map_err(|e| format!("cannot be compiled now: {e}"))?
                .join()
                .map_err(|_| "cannot be compiled: the parser failed".to_string())?
        })?;
        let (unknown, uses_data) = variables(program.expression());
        if let Some(unknown) = unknown {
            return Err(format!(
                "unknown variable `{unknown}`: a filter sees the event's `id`, `type`, `tenant` \
                 and `data`"
            ));
        }
        Ok(EventFilter {
            source: source.to_string(),
            program: Arc::new(program),
            uses_data,
        })
    }

    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn program(&self) -> &cel::Program {
        &self.program
    }

    /// Whether the expression reads the event's `data`.
    pub fn uses_data(&self) -> bool {
        self.uses_data
    }
}

/// The first identifier (in the order of the tree walk) that is neither an event field nor a
/// variable a macro binds (`exists(i, …)`; a function name is not an identifier), and whether
/// `data` is read.
fn variables(root: &cel::IdedExpr) -> (Option<String>, bool) {
    use cel::common::ast::Expr;
    let mut bound: Vec<&str> = Vec::new();
    let mut idents: Vec<&str> = Vec::new();
    let mut stack = vec![root];
    while let Some(node) = stack.pop() {
        match &node.expr {
            Expr::Ident(name) => idents.push(name),
            Expr::Comprehension(c) => {
                bound.push(&c.iter_var);
                bound.extend(c.iter_var2.as_deref());
                bound.push(&c.accu_var);
            }
            _ => {}
        }
        stack.extend(children(node));
    }
    let unknown = idents
        .iter()
        .find(|i| !FILTER_VARIABLES.contains(i) && !bound.contains(i))
        .map(|i| i.to_string());
    (
        unknown,
        idents.contains(&"data") && !bound.contains(&"data"),
    )
}

/// Refuses what would make one evaluation cost more than linear in the event's size: a macro
/// inside another macro's per-element body (quadratic: 1.7 s for 2,000 items, measured), more
/// than [`FILTER_MAX_MACROS`] macros, more than [`FILTER_MAX_PLUS`] `+`. What is left costs at
/// most a few linear passes over the event (`docs/delivery.md`, "Payload filters").
fn bounded_cost(root: &cel::IdedExpr) -> Result<(), String> {
    use cel::common::ast::Expr;
    let (mut macros, mut plus) = (0, 0);
    let mut stack = vec![(root, false)];
    while let Some((node, per_element)) = stack.pop() {
        match &node.expr {
            Expr::Comprehension(c) => {
                if per_element {
                    return Err(
                        "a macro (exists, all, exists_one, map, filter) inside another's \
                         per-element expression is not allowed: its cost grows with the square \
                         of the event's size (chain them instead: `data.a.filter(…).exists(…)`)"
                            .into(),
                    );
                }
                macros += 1;
                stack.extend([
                    (&c.iter_range, false),
                    (&c.accu_init, false),
                    (&c.result, false),
                ]);
                stack.extend([(&c.loop_cond, true), (&c.loop_step, true)]);
                continue;
            }
            // Macro expansions add to their accumulator with `_+_`: not counted there.
            Expr::Call(call) if call.func_name == "_+_" && !per_element => plus += 1,
            _ => {}
        }
        stack.extend(children(node).into_iter().map(|c| (c, per_element)));
    }
    if macros > FILTER_MAX_MACROS {
        return Err(format!(
            "uses {macros} macros (exists, all, exists_one, map, filter); at most \
             {FILTER_MAX_MACROS}"
        ));
    }
    if plus > FILTER_MAX_PLUS {
        return Err(format!("uses `+` {plus} times; at most {FILTER_MAX_PLUS}"));
    }
    Ok(())
}

/// The depth of an expression tree, walked without recursion.
fn depth(root: &cel::IdedExpr) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(root, 1usize)];
    while let Some((node, d)) = stack.pop() {
        deepest = deepest.max(d);
        stack.extend(children(node).into_iter().map(|c| (c, d + 1)));
    }
    deepest
}

fn entries(entries: &[cel::common::ast::IdedEntryExpr]) -> Vec<&cel::IdedExpr> {
    use cel::common::ast::EntryExpr;
    entries
        .iter()
        .flat_map(|e| match &e.expr {
            EntryExpr::MapEntry(m) => vec![&m.key, &m.value],
            EntryExpr::StructField(f) => vec![&f.value],
        })
        .collect()
}

fn children(node: &cel::IdedExpr) -> Vec<&cel::IdedExpr> {
    use cel::common::ast::Expr;
    match &node.expr {
        Expr::Call(call) => call
            .target
            .iter()
            .map(|t| &**t)
            .chain(call.args.iter())
            .collect(),
        Expr::Comprehension(c) => vec![
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ],
        Expr::List(list) => list.elements.iter().collect(),
        Expr::Select(select) => vec![&*select.operand],
        Expr::Map(map) => entries(&map.entries),
        Expr::Struct(st) => entries(&st.entries),
        Expr::Unspecified | Expr::Ident(_) | Expr::Literal(_) => Vec::new(),
    }
}

/// `at 1:7: mismatched input …` per error, the first three.
fn describe_parse_errors(e: &cel::ParseErrors) -> String {
    let mut parts: Vec<String> = e
        .errors
        .iter()
        .take(3)
        .map(|p| format!("at {}:{}: {}", p.pos.0, p.pos.1, p.msg))
        .collect();
    if e.errors.len() > 3 {
        parts.push(format!("and {} more", e.errors.len() - 3));
    }
    if parts.is_empty() {
        return "not a CEL expression".into();
    }
    format!("not a CEL expression: {}", parts.join("; "))
}

impl PartialEq for EventFilter {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Eq for EventFilter {}

impl fmt::Debug for EventFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.source, f)
    }
}

impl<'de> Deserialize<'de> for EventFilter {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        EventFilter::compile(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compiles_or_names_the_position() {
        for ok in [
            "type == 'order.paid'",
            "data.amount > 100 && tenant == 'acme'",
            "has(data.customer) && data.customer.tier in ['gold', 'platinum']",
            "data.items.exists(i, i.sku.startsWith('A'))",
            "data.region.matches('^eu-')",
            "id != ''",
        ] {
            EventFilter::compile(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        let err = EventFilter::compile("data.amount >").expect_err("incomplete");
        assert!(err.starts_with("not a CEL expression: at 1:"), "{err}");
        assert!(!EventFilter::compile("type == 'a'").expect("ok").uses_data());
        assert!(EventFilter::compile("has(data.a)").expect("ok").uses_data());
        let err = EventFilter::compile("typ == 'x'").expect_err("unknown");
        assert!(err.contains("unknown variable `typ`"), "{err}");
        assert!(EventFilter::compile(" ").is_err());
        let long = format!("type == '{}'", "x".repeat(FILTER_MAX_BYTES));
        assert!(EventFilter::compile(&long)
            .expect_err("long")
            .contains("at most"));
    }

    #[test]
    fn more_than_linear_cost_is_refused() {
        for ok in [
            "data.orders.filter(o, o.total > 10).exists(o, o.region == 'eu')",
            "data.a.exists(x, x > 1) && data.b.all(x, x + 1 > 0) && size(data.c.map(x, x)) > 0",
        ] {
            EventFilter::compile(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        let nested =
            EventFilter::compile("data.a.exists(x, data.a.exists(y, y == x))").expect_err("nested");
        assert!(nested.contains("square"), "{nested}");
        let five = ["data.a.exists(x, x > 0)"; 5].join(" || ");
        assert!(EventFilter::compile(&five)
            .expect_err("five")
            .contains("at most 4"));
        let sum = vec!["data.s"; 18].join(" + ");
        let err = EventFilter::compile(&format!("size({sum}) > 0")).expect_err("plus");
        assert!(err.contains("`+` 17 times"), "{err}");
    }

    #[test]
    fn hostile_nesting_is_refused_without_overflowing_a_small_stack() {
        // Tokio's worker threads have 2 MiB stacks; check on a smaller one.
        let deep = format!("{}1{}", "(".repeat(2000), ")".repeat(2000));
        let deep_list = format!("{}1{}", "[".repeat(1500), "]".repeat(1500));
        let unary = format!("{}true", "!".repeat(4000));
        std::thread::Builder::new()
            .stack_size(1 << 20)
            .spawn(move || {
                for text in [deep, deep_list] {
                    assert!(EventFilter::compile(&text).is_err(), "{}", &text[..10]);
                }
                // The parser folds `!!x` into `x`: harmless, but it must not overflow either.
                assert!(EventFilter::compile(&unary).is_ok());
                // Long chains of `||` / `&&` are balanced by the parser: accepted.
                let chain = vec!["id == 'a'"; 250].join("||");
                assert!(EventFilter::compile(&chain).is_ok());
                // Within the parser's nesting guard, deeper than evaluation may go: refused.
                let lists = format!("{}1{}", "[".repeat(80), "]".repeat(80));
                let err = EventFilter::compile(&lists).expect_err("deep");
                assert!(err.contains("81 levels deep"), "{err}");
            })
            .expect("thread")
            .join()
            .expect("no overflow");
    }
}
