//! Values bound into statements built at run time (multi-row upserts, `IN` lists, the job
//! listings' filters): `Param`, `bind_params!` to bind them in order on either dialect, and
//! `placeholders` to number them.

/// A value bound into a dynamically built query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Param {
    Text(String),
    Int(i64),
    Bool(bool),
    /// Text or a NULL of text's type.
    OptText(Option<String>),
    /// An integer or a NULL of an integer's type.
    OptInt(Option<i64>),
}

/// Binds every `Param` of `$params` on `$query`, in order.
macro_rules! bind_params {
    ($query:expr, $params:expr) => {{
        let mut query = $query;
        for param in $params {
            query = match param {
                $crate::db::params::Param::Text(text) => query.bind(text.clone()),
                $crate::db::params::Param::Int(value) => query.bind(*value),
                $crate::db::params::Param::Bool(value) => query.bind(*value),
                $crate::db::params::Param::OptText(value) => query.bind(value.clone()),
                $crate::db::params::Param::OptInt(value) => query.bind(*value),
            };
        }
        query
    }};
}
pub(crate) use bind_params;

/// `$first, $first+1, …` for `n` values.
pub(crate) fn placeholders(first: usize, n: usize) -> String {
    (first..first + n).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_number_from_the_first() {
        assert_eq!(placeholders(2, 3), "$2, $3, $4");
        assert_eq!(placeholders(1, 1), "$1");
    }
}
