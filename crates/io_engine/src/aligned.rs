//! A heap buffer aligned for direct I/O (tests, benchmarks and the probe read).

use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// `len` zeroed bytes aligned to `align` (a power of two). Freed on drop.
#[derive(Debug)]
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer is plain owned memory; access is through &/&mut self.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates; `None` if `len` is 0, `align` is not a power of two, or memory is short.
    pub fn new(len: usize, align: usize) -> Option<Self> {
        let layout = Layout::from_size_align(len, align)
            .ok()
            .filter(|l| l.size() > 0)?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) })?;
        Some(Self { ptr, layout })
    }
    /// Start address.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for layout.size() initialised bytes while self lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }
    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.layout.size()
    }
    /// Never true (zero-length buffers are not created).
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}
