//! The `.ftw` model file: layout constants, a streaming writer and a validating reader.
