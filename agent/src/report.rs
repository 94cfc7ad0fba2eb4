//! Error text for logs and status reports.

use std::error::Error;
use std::fmt;

/// Displays an error with its `source()` chain, `outer: cause: root cause`, leaving out a
/// source whose text the message already ends with.
///
/// Many errors already print their source in their own message (`thiserror`'s
/// `#[error("…: {0}")]` with `#[from]`, sqlx's "error communicating with database: …"), and
/// some wrappers print exactly what they wrap; walking the chain naively then repeats
/// itself ("tcp connect error: tcp connect error: Connection refused"). Each part is
/// printed once, in order.
///
/// ```
/// use levee_agent::report::ErrorChain;
///
/// #[derive(Debug)]
/// struct Wrapped(std::io::Error);
/// impl std::fmt::Display for Wrapped {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         write!(f, "error communicating with database: {}", self.0) // includes its source
///     }
/// }
/// impl std::error::Error for Wrapped {
///     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
///         Some(&self.0)
///     }
/// }
///
/// let e = Wrapped(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused"));
/// assert_eq!(ErrorChain(&e).to_string(), "error communicating with database: connection refused");
/// ```
#[derive(Clone, Copy, Debug)]
pub struct ErrorChain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = self.0.to_string();
        let mut cur = self.0.source();
        while let Some(e) = cur {
            let part = e.to_string();
            if !part.is_empty() && !text.ends_with(&part) {
                text.push_str(": ");
                text.push_str(&part);
            }
            cur = e.source();
        }
        f.write_str(&text)
    }
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    /// An error with a fixed message and an optional source.
    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<dyn Error + 'static>>);

    impl fmt::Display for Layer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl Error for Layer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref()
        }
    }

    #[test]
    fn each_part_of_a_chain_is_printed_once() {
        let refused = || Box::new(io::Error::new(io::ErrorKind::ConnectionRefused, "Connection refused"));
        // A wrapper that prints exactly what it wraps (as hyper's connect error does).
        let e = Layer(
            "transport error",
            Some(Box::new(Layer(
                "tcp connect error",
                Some(Box::new(Layer("tcp connect error", Some(refused())))),
            ))),
        );
        assert_eq!(ErrorChain(&e).to_string(), "transport error: tcp connect error: Connection refused");
        // A plain chain is printed whole.
        let e = Layer("loading the cache", Some(Box::new(Layer("reading rev-1.json", Some(refused())))));
        assert_eq!(ErrorChain(&e).to_string(), "loading the cache: reading rev-1.json: Connection refused");
        // No source: the message alone.
        assert_eq!(ErrorChain(&*refused()).to_string(), "Connection refused");
    }
}
