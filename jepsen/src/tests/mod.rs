//! The checkers must catch bugs: hand-built bad histories fail, good ones pass.

mod bad_histories;
mod builder;
mod good_histories;
mod wgl_differential;
mod wgl_search;
