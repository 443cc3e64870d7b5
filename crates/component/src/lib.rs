//! The component guest (work in progress).
