//! A step: one operation as it goes over the wire — a script invocation (or a plain command) and
//! the parser of its reply — with no I/O. Each primitive builds its steps once, in its own file
//! (`lock.rs`, `semaphore.rs`, `rwlock.rs`, `cache.rs`); the engine's executor runs any of them on
//! whichever connection fits.

use redis::{Cmd, ScriptInvocation, Value};

use super::replies::UnexpectedReply;

/// What goes over the wire.
pub enum Call {
    /// EVALSHA (loading the script on NOSCRIPT).
    Script(ScriptInvocation<'static>),
    /// A plain command (a read).
    Command(Cmd),
}

type Parser<T> = Box<dyn Fn(Value) -> Result<T, UnexpectedReply> + Send + Sync>;

/// One operation: its call, and what its reply means.
pub struct Step<T> {
    call: Call,
    parse: Parser<T>,
}

impl<T> Step<T> {
    pub fn script(
        invocation: ScriptInvocation<'static>,
        parse: impl Fn(Value) -> Result<T, UnexpectedReply> + Send + Sync + 'static,
    ) -> Self {
        Step {
            call: Call::Script(invocation),
            parse: Box::new(parse),
        }
    }

    pub fn command(
        cmd: Cmd,
        parse: impl Fn(Value) -> Result<T, UnexpectedReply> + Send + Sync + 'static,
    ) -> Self {
        Step {
            call: Call::Command(cmd),
            parse: Box::new(parse),
        }
    }

    pub fn call(&self) -> &Call {
        &self.call
    }

    /// The script invocation, when the step is one.
    pub fn invocation(&self) -> Option<&ScriptInvocation<'static>> {
        match &self.call {
            Call::Script(inv) => Some(inv),
            Call::Command(_) => None,
        }
    }

    pub fn parse(&self, reply: Value) -> Result<T, UnexpectedReply> {
        (self.parse)(reply)
    }

    /// The same call, its parsed reply then turned by `f`.
    pub fn map<U>(self, f: impl Fn(T) -> U + Send + Sync + 'static) -> Step<U>
    where
        T: 'static,
    {
        let parse = self.parse;
        Step {
            call: self.call,
            parse: Box::new(move |reply| parse(reply).map(&f)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::replies::parse_flag;

    #[test]
    fn a_step_parses_its_reply_and_maps_it() {
        let step = Step::command(redis::cmd("PING"), |v| parse_flag(&v));
        assert!(step.invocation().is_none());
        assert_eq!(step.parse(Value::Int(1)), Ok(true));
        let mapped = step.map(|ok| if ok { "yes" } else { "no" });
        assert_eq!(mapped.parse(Value::Int(0)), Ok("no"));
        assert!(mapped.parse(Value::Nil).is_err());
    }
}
