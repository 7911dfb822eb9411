//! The I/O engine: direct-I/O worker threads and the demand/prefetch scheduler that
//! fill the expert cache's slots from a `.ftw` file. See `../shared/ARCHITECTURE.md`,
//! "The I/O engine".
