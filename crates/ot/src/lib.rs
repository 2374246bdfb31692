//! mbx-ot (in progress).
