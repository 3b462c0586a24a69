//! Closed sets of names: the scenario's choices (inbox modes, relay orders,
//! …) and the verifier's anomaly kinds. Each is an enum with its text, a
//! parser and the list error messages show, declared once with [`choices!`].

/// Declares a closed set of names a scenario key may take, with parsing and
/// the list shown in error messages.
#[macro_export]
macro_rules! choices {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
        pub enum $name {
            $($(#[$vdoc])* #[serde(rename = $text)] $variant),+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            // Not every choice is read from a scenario.
            #[allow(dead_code)]
            pub fn parse(s: &str) -> Option<Self> {
                match s {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            /// `"a", "b" or "c"`, for error messages.
            // Not every choice is read from a file, so not every one names its values.
            #[allow(dead_code)]
            pub fn names() -> String {
                let all: Vec<String> = Self::ALL.iter().map(|v| format!("{:?}", v.as_str())).collect();
                match all.split_last() {
                    Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
                    _ => all.join(""),
                }
            }
        }
    };
}
