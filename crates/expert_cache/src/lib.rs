//! The RAM expert cache: slot pools per streamed layer over one page-aligned arena,
//! and the eviction policy that decides which experts stay (pure logic: no threads,
//! no I/O, no clock). See `../shared/ARCHITECTURE.md`, "The RAM expert cache".
