//! bad input
