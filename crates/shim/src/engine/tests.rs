//! Unit tests of the engine against a fake driver.
