//! Test-only reading of a script's Lua source: which of its `local function`s its code never
//! reaches. Each one costs Redis a closure on every call of the script (see clock.lua), so the
//! scripts take only the preludes they call, and the modules' tests check it with this.

/// The functions `source` defines that neither its top-level code calls nor a function that it
/// reaches does. Comments do not count as calls. Functions are defined at the top level, from a
/// line `local function name(` to the line `end` (the style of every prelude).
pub fn uncalled_functions(source: &str) -> Vec<String> {
    let mut functions: Vec<(String, String)> = Vec::new();
    let mut top = String::new();
    let mut inside = false;
    for line in source.lines() {
        let code = line.split("--").next().unwrap_or("");
        if let Some(rest) = code.strip_prefix("local function ") {
            let name = rest.split('(').next().unwrap_or("").trim().to_string();
            functions.push((name, String::new()));
            inside = true;
        } else if inside && code.trim_end() == "end" {
            inside = false;
        } else {
            let into = match functions.last_mut() {
                Some((_, body)) if inside => body,
                _ => &mut top,
            };
            into.push_str(code);
            into.push('\n');
        }
    }
    let mut reached = vec![false; functions.len()];
    let mut to_read = vec![top];
    while let Some(code) = to_read.pop() {
        for (i, (name, body)) in functions.iter().enumerate() {
            if !reached[i] && calls(&code, name) {
                reached[i] = true;
                to_read.push(body.clone());
            }
        }
    }
    functions
        .into_iter()
        .zip(reached)
        .filter_map(|((name, _), reached)| (!reached).then_some(name))
        .collect()
}

/// Whether `code` calls `name` (not a longer name that ends with it).
fn calls(code: &str, name: &str) -> bool {
    code.match_indices(&format!("{name}(")).any(|(at, _)| {
        !code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

#[cfg(test)]
mod tests {
    use super::uncalled_functions;

    #[test]
    fn finds_what_no_reached_code_calls() {
        let source = "local function a()\n  return 1\nend\n\
                      local function b()\n  return c()\nend\n\
                      local function c()\n  return 2\nend\n\
                      local function d()\n  return 3\nend\n\
                      -- d() is only named in a comment; xd() is another function\n\
                      return a() + xd()";
        // b is not called, so c (called by b only) is not reached either.
        assert_eq!(uncalled_functions(source), ["b", "c", "d"]);
        let reached = "local function a()\n  return b()\nend\nlocal function b()\nend\nreturn a()";
        assert!(uncalled_functions(reached).is_empty());
    }
}
