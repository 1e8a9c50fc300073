//! Owner tokens: 128 random bits from the OS, written as 32 lowercase hex characters.

use super::error::{Error, Result};

pub fn new_token() -> Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| Error::Usage(format!("no randomness for a lock token: {e}")))?;
    Ok(uuid::Uuid::from_bytes(bytes).simple().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_32_hex_and_distinct() {
        let a = new_token().unwrap_or_default();
        let b = new_token().unwrap_or_default();
        assert_eq!(a.len(), 32);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
    }
}
