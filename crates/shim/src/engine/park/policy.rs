//! The idle policy (`VRAMCAP_PARK=idle:T`): filled in by the next step.
