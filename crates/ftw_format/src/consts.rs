//! Every numeric constant of the format, in one place. `python/flint/format/constants.py`
//! mirrors these and a test checks that both agree.

/// First 8 bytes of every `.ftw` file.
pub const MAGIC: [u8; 8] = *b"FLINTFTW";
/// First 8 bytes of the footer, the last `HEADER_STRUCT_SIZE` bytes of the file.
pub const FOOTER_MAGIC: [u8; 8] = *b"FTWFOOT1";
/// The only version this reader understands.
pub const FORMAT_VERSION: u32 = 1;
/// Alignment of the sections holding tensor and expert data, of every dense tensor,
/// expert slab and expert projection (the direct-I/O unit).
pub const ALIGN: u64 = 4096;
/// Size of the header page at offset 0 (the header struct, then zeros).
pub const HEADER_PAGE: u64 = 4096;
/// Encoded size of the header struct; the footer has the same size.
pub const HEADER_STRUCT_SIZE: usize = 192;
/// Alignment of the scale block that follows quantized weights inside a projection.
pub const SCALE_ALIGN: u64 = 64;
/// Encoded size of one expert index record.
pub const EXPERT_RECORD_SIZE: usize = 80;
/// Encoded size of the expert layout block at the start of the expert index.
pub const EXPERT_LAYOUT_SIZE: usize = 40;

/// Largest metadata JSON accepted (tokenizers of big vocabularies are several MiB).
pub const MAX_METADATA_BYTES: u64 = 256 << 20;
/// Most dense tensors accepted in one file.
pub const MAX_TENSORS: u64 = 1 << 20;
/// Longest tensor name accepted, in bytes.
pub const MAX_NAME_BYTES: usize = 1024;
/// Most dimensions of one tensor.
pub const MAX_DIMS: usize = 8;
/// Most layers of the expert grid.
pub const MAX_LAYERS: u32 = 4096;
/// Most experts per layer.
pub const MAX_EXPERTS_PER_LAYER: u32 = 1 << 16;
/// Largest row or column count of one expert projection.
pub const MAX_PROJ_DIM: u32 = 1 << 24;
/// Largest quantization group size.
pub const MAX_GROUP_SIZE: u32 = 1 << 12;
/// Largest size of one tensor or projection (1 TiB): bounds all arithmetic on sizes.
pub const MAX_ITEM_BYTES: u64 = 1 << 40;
