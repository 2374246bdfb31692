//! The names under which flags and configuration files spell the choices endpoints and
//! middleboxes make ([`Tokenization`], [`CaseMode`], [`Privacy`], [`BufferPolicy`]): one table per
//! type gives both `FromStr` and `Display`, so parsing and printing cannot drift apart.

use crate::channel::Privacy;
use crate::rules::BufferPolicy;
use crate::tokenize::{CaseMode, Tokenization};

/// `(value, name)`: the first name of a value is how it prints; later ones are accepted aliases.
type Names<T> = &'static [(T, &'static str)];

const TOKENIZATION: Names<Tokenization> = &[
    (Tokenization::Window, "window"),
    (Tokenization::Delimiter, "delimiter"),
];
const CASE_MODE: Names<CaseMode> = &[(CaseMode::Exact, "exact"), (CaseMode::Dual, "dual")];
const PRIVACY: Names<Privacy> = &[
    (Privacy::ExactMatch, "exact-match"),
    (Privacy::ExactMatch, "exact"),
    (Privacy::ProbableCause, "probable-cause"),
];
const BUFFER_POLICY: Names<BufferPolicy> = &[
    (BufferPolicy::Approximate, "approximate"),
    (BufferPolicy::Strict, "strict"),
];

fn parse<T: Copy>(s: &str, names: Names<T>, what: &str) -> Result<T, String> {
    names
        .iter()
        .find(|(_, n)| *n == s)
        .map(|(v, _)| *v)
        .ok_or_else(|| {
            let known: Vec<&str> = names.iter().map(|(_, n)| *n).collect();
            format!("unknown {what} {s:?} (use {})", known.join(", "))
        })
}

fn name<T: PartialEq>(v: &T, names: Names<T>) -> &'static str {
    names.iter().find(|(x, _)| x == v).map_or("?", |(_, n)| *n)
}

macro_rules! named {
    ($t:ty, $table:expr, $what:literal) => {
        impl std::str::FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                parse(s, $table, $what)
            }
        }

        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(name(self, $table))
            }
        }
    };
}

named!(Tokenization, TOKENIZATION, "tokenization");
named!(CaseMode, CASE_MODE, "case mode");
named!(Privacy, PRIVACY, "privacy mode");
named!(BufferPolicy, BUFFER_POLICY, "buffer policy");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_prints_as_a_name_that_parses_back() {
        fn round_trip<T>(names: Names<T>)
        where
            T: Copy + PartialEq + std::fmt::Debug + std::fmt::Display + std::str::FromStr,
            <T as std::str::FromStr>::Err: std::fmt::Debug,
        {
            for (v, _) in names {
                assert_eq!(v.to_string().parse::<T>().unwrap(), *v);
            }
        }
        round_trip(TOKENIZATION);
        round_trip(CASE_MODE);
        round_trip(PRIVACY);
        round_trip(BUFFER_POLICY);
        assert_eq!(Privacy::ExactMatch.to_string(), "exact-match");
        assert_eq!("exact".parse::<Privacy>(), Ok(Privacy::ExactMatch));
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        assert_eq!(
            "exactly".parse::<Privacy>(),
            Err("unknown privacy mode \"exactly\" (use exact-match, exact, probable-cause)".into())
        );
        assert_eq!(
            "windows".parse::<Tokenization>(),
            Err("unknown tokenization \"windows\" (use window, delimiter)".into())
        );
    }
}
