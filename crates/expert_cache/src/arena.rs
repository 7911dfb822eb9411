//! The memory behind the slots: one page-aligned allocation, cut into equal slots,
//! `slots_per_layer` for each streamed layer, layer-major.
//!
//! Why one arena: it can be page-locked (cudaHostRegister) in one call for fast GPU
//! uploads, wrapped by Python as one buffer, and every slot offset is a multiple of
//! 4 KiB, as O_DIRECT reads need. Slot size is the largest expert slab rounded up to
//! 4 KiB, so any expert fits any slot of its layer.
//!
//! On Linux the arena is its own anonymous mapping, 2 MiB aligned and advised for
//! transparent huge pages (`MADV_HUGEPAGE`): untouched slots cost no resident memory
//! and no time at creation, and the expert kernels that stream through a slot walk
//! 2 MiB pages instead of 4 KiB ones where the kernel grants them. Elsewhere (and if
//! the mapping fails) it is `alloc_zeroed`, which writes every byte once: an
//! allocation aligned beyond malloc's is not handed out as fresh zero pages.
//!
//! # Lifetime contract
//! - The arena owns its memory. It never moves, grows or shrinks; it is freed when the
//!   `Arena` is dropped. Pointers from [`Arena::as_ptr`] / [`Arena::slot_ptr`] are
//!   valid for exactly that long, and holders (the I/O engine, a Python buffer or
//!   tensor view) must keep the `Arena` alive while they use them.
//! - The arena never reads or writes the bytes itself, except that
//!   [`Arena::release_slot`] gives a slot's pages back to the OS (they read as zeros
//!   until written again), under the caller's promise that nobody uses the slot. Who may touch a slot is decided
//!   by the cache: a slot is written only while pinned for a read into it, and read
//!   only while its expert is resident (pinned while a GPU copy is in flight). The
//!   arena does not enforce this; two writers to one slot are the caller's data race.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

use crate::error::{CacheError, Result};

/// Alignment of the arena and of every slot (the page size O_DIRECT needs).
pub const SLOT_ALIGN: u64 = 4096;

/// Shape of an arena: how many slots of what size for how many layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaPlan {
    /// Streamed layers.
    pub n_layers: usize,
    /// Slots in each layer's pool.
    pub slots_per_layer: usize,
    /// Bytes per slot, a multiple of [`SLOT_ALIGN`].
    pub slot_bytes: u64,
}

impl ArenaPlan {
    /// As many slots per layer as `budget_bytes` holds (at most `n_experts`, more
    /// could never be used), each sized for the largest slab rounded up to 4 KiB.
    pub fn from_budget(
        budget_bytes: u64,
        n_layers: usize,
        n_experts: u32,
        max_slab_bytes: u64,
    ) -> Result<Self> {
        for (what, n) in [
            ("layers", n_layers as u64),
            ("experts", u64::from(n_experts)),
            ("slab bytes", max_slab_bytes),
        ] {
            if n == 0 {
                return Err(CacheError::Zero { what });
            }
        }
        let slot_bytes = max_slab_bytes
            .checked_next_multiple_of(SLOT_ALIGN)
            .ok_or(CacheError::Overflow { what: "slot size" })?;
        let layer_row = slot_bytes
            .checked_mul(n_layers as u64)
            .ok_or(CacheError::Overflow {
                what: "one slot per layer",
            })?;
        let slots = (budget_bytes / layer_row).min(u64::from(n_experts));
        if slots == 0 {
            return Err(CacheError::BudgetTooSmall {
                budget: budget_bytes,
                slot_bytes,
                n_layers,
            });
        }
        let slots_per_layer =
            usize::try_from(slots).map_err(|_| CacheError::Overflow { what: "slots" })?;
        Ok(Self {
            n_layers,
            slots_per_layer,
            slot_bytes,
        })
    }

    /// Total slots (all layers).
    pub fn total_slots(&self) -> Result<usize> {
        self.n_layers
            .checked_mul(self.slots_per_layer)
            .ok_or(CacheError::Overflow { what: "slot count" })
    }

    /// Total bytes of the arena.
    pub fn total_bytes(&self) -> Result<usize> {
        let slot = usize::try_from(self.slot_bytes)
            .map_err(|_| CacheError::Overflow { what: "slot size" })?;
        self.total_slots()?
            .checked_mul(slot)
            .ok_or(CacheError::Overflow { what: "arena size" })
    }
}

/// Alignment of the mapping on Linux: a transparent huge page.
const HUGE_PAGE: usize = 2 << 20;

/// Where the arena's memory came from (and how it goes back).
#[derive(Debug)]
enum Backing {
    /// Its own mapping of this many bytes (Linux).
    Mapped(usize),
    /// The global allocator.
    Allocated(Layout),
}

/// One page-aligned allocation holding every slot. See the module's lifetime contract.
#[derive(Debug)]
pub struct Arena {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
    plan: ArenaPlan,
}

// SAFETY: the arena is a plain owned allocation; it never touches the bytes itself, and
// access to slot contents is coordinated by the cache's pins (see the module docs).
unsafe impl Send for Arena {}
// SAFETY: as above; `&Arena` only hands out addresses.
unsafe impl Sync for Arena {}

impl Arena {
    /// Allocates the arena for `plan`, zeroed.
    pub fn new(plan: ArenaPlan) -> Result<Self> {
        let bytes = plan.total_bytes()?;
        if bytes == 0 {
            return Err(CacheError::Zero { what: "arena size" });
        }
        if let Some(ptr) = map_huge(bytes) {
            return Ok(Self {
                ptr,
                len: bytes,
                backing: Backing::Mapped(bytes),
                plan,
            });
        }
        let layout = Layout::from_size_align(bytes, SLOT_ALIGN as usize).map_err(|_| {
            CacheError::Overflow {
                what: "arena layout",
            }
        })?;
        // SAFETY: `layout` has a non-zero size (checked above).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(CacheError::AllocFailed { bytes })?;
        Ok(Self {
            ptr,
            len: bytes,
            backing: Backing::Allocated(layout),
            plan,
        })
    }

    /// The arena's shape.
    pub fn plan(&self) -> ArenaPlan {
        self.plan
    }

    /// Start of the arena (4 KiB aligned). Valid while `self` lives.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: an arena holds at least one slot.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Byte offset of `slot` of `layer` from [`Arena::as_ptr`].
    pub fn slot_offset(&self, layer: usize, slot: usize) -> Result<usize> {
        let n_layers = self.plan.n_layers;
        if layer >= n_layers {
            return Err(CacheError::LayerOutOfRange { layer, n_layers });
        }
        let slots_per_layer = self.plan.slots_per_layer;
        if slot >= slots_per_layer {
            return Err(CacheError::SlotOutOfRange {
                slot,
                slots_per_layer,
            });
        }
        // In range, so below total_slots and total_bytes, which were checked at new().
        Ok((layer * self.plan.slots_per_layer + slot) * self.plan.slot_bytes as usize)
    }

    /// Address of `slot` of `layer`; `slot_bytes` bytes are valid from it while `self`
    /// lives.
    pub fn slot_ptr(&self, layer: usize, slot: usize) -> Result<*mut u8> {
        let offset = self.slot_offset(layer, slot)?;
        Ok(self.as_ptr().wrapping_add(offset))
    }

    /// Gives the memory of `slot` of `layer` back to the OS: `madvise(MADV_DONTNEED)` on
    /// the whole pages inside the slot, so its resident memory drops now; the slot
    /// reads as zeros and its pages fault back in (zeroed) when next written. The
    /// address stays valid. Returns the bytes given back (0 on platforms without the
    /// call, where nothing changes).
    ///
    /// # Safety
    /// Nobody may read or write the slot's bytes during the call or rely on them after
    /// it (no pin, no expert resident in it, no view of it in use), and the arena must
    /// not be page-locked for a device (`cudaHostRegister`): the device would keep
    /// the old pages.
    pub unsafe fn release_slot(&self, layer: usize, slot: usize) -> Result<usize> {
        let offset = self.slot_offset(layer, slot)?;
        let len = usize::try_from(self.plan.slot_bytes)
            .map_err(|_| CacheError::Overflow { what: "slot size" })?;
        let start = self.as_ptr() as usize + offset;
        release_pages(start, len).map_err(|source| CacheError::Release {
            layer,
            slot,
            source,
        })
    }
}

/// `madvise(MADV_DONTNEED)` on the whole pages inside `[start, start + len)`; returns
/// their bytes. The range is inside one live allocation (checked by the caller).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn release_pages(start: usize, len: usize) -> std::io::Result<usize> {
    let page = page_size();
    let first = start.next_multiple_of(page);
    let end = (start + len) / page * page;
    if end <= first {
        return Ok(0);
    }
    let bytes = end - first;
    let at = first as *mut libc::c_void;
    // The range first leaves transparent huge pages: dropping part of a huge page only
    // splits it (its memory goes back when the kernel's deferred split runs), and
    // khugepaged could collapse the emptied range into a resident huge page again.
    // SAFETY: [first, end) is whole pages inside the arena's allocation (rounded inward
    // from the slot's range), so no memory outside the arena is affected; the advice
    // changes no bytes (a refused one leaves the pages as they are).
    unsafe { libc::madvise(at, bytes, libc::MADV_NOHUGEPAGE) };
    // SAFETY: the same range; the caller promised nobody uses these bytes (see
    // `Arena::release_slot`). MADV_DONTNEED on private anonymous memory only drops the
    // pages; later accesses read zeros.
    let rc = unsafe { libc::madvise(at, bytes, libc::MADV_DONTNEED) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(bytes)
}

/// No way to give pages back here: nothing happens.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn release_pages(_start: usize, _len: usize) -> std::io::Result<usize> {
    Ok(0)
}

/// The OS page size (4 KiB where it cannot be read).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page)
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(SLOT_ALIGN as usize)
}

/// A fresh anonymous mapping of `bytes` (rounded up to whole pages) at a 2 MiB boundary,
/// advised for huge pages; None if the kernel refuses the mapping (a refused advice
/// is ignored: the arena then has 4 KiB pages).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn map_huge(bytes: usize) -> Option<NonNull<u8>> {
    let page = page_size();
    let bytes = bytes.checked_next_multiple_of(page)?; // whole pages to unmap the tail
    let reserve = bytes.checked_add(HUGE_PAGE)?;
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    // SAFETY: a new private anonymous mapping; it overlaps nothing.
    let raw = unsafe { libc::mmap(std::ptr::null_mut(), reserve, prot, flags, -1, 0) };
    if raw == libc::MAP_FAILED {
        return None;
    }
    let base = raw as usize;
    let start = base.next_multiple_of(HUGE_PAGE);
    let (head, tail) = (start - base, base + reserve - (start + bytes));
    // SAFETY: the head and the tail are whole pages of the mapping just made (`base`,
    // `start` and `bytes` are multiples of the page size), outside the
    // arena's `[start, start + bytes)`; nothing else refers to them.
    unsafe {
        if head > 0 {
            libc::munmap(raw, head);
        }
        if tail > 0 {
            libc::munmap((start + bytes) as *mut libc::c_void, tail);
        }
        libc::madvise(start as *mut libc::c_void, bytes, libc::MADV_HUGEPAGE);
    }
    NonNull::new(start as *mut u8)
}

/// The global allocator instead.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn map_huge(_bytes: usize) -> Option<NonNull<u8>> {
    None
}

impl Drop for Arena {
    fn drop(&mut self) {
        match self.backing {
            // SAFETY: `ptr` is the start of a mapping of `len` bytes made by
            // `map_huge`, unmapped only here.
            #[cfg(any(target_os = "linux", target_os = "android"))]
            Backing::Mapped(len) => unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), len);
            },
            #[cfg(not(any(target_os = "linux", target_os = "android")))]
            Backing::Mapped(_) => {}
            // SAFETY: `ptr` came from `alloc_zeroed(layout)` and is freed only here.
            Backing::Allocated(layout) => unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_rounds_slots_to_pages_and_divides_the_budget() -> Result<()> {
        let plan = ArenaPlan::from_budget(10 * 8192 * 3 + 100, 3, 64, 5000)?;
        assert_eq!((plan.slot_bytes, plan.slots_per_layer), (8192, 10));
        assert_eq!(plan.total_bytes()?, 30 * 8192);
        let capped = ArenaPlan::from_budget(u64::MAX, 2, 4, 4096)?;
        assert_eq!(capped.slots_per_layer, 4, "never more slots than experts");
        Ok(())
    }

    #[test]
    fn too_small_a_budget_and_zero_sizes_are_errors() {
        assert!(matches!(
            ArenaPlan::from_budget(4095, 1, 8, 1),
            Err(CacheError::BudgetTooSmall { .. })
        ));
        assert!(matches!(
            ArenaPlan::from_budget(1 << 20, 0, 8, 1),
            Err(CacheError::Zero { .. })
        ));
        assert!(matches!(
            ArenaPlan::from_budget(u64::MAX, 2, 8, u64::MAX),
            Err(CacheError::Overflow { .. })
        ));
    }

    fn bytes_at(p: *const u8, len: usize) -> Vec<u8> {
        // SAFETY: the tests pass a slot of a live arena that nobody writes meanwhile.
        unsafe { std::slice::from_raw_parts(p, len) }.to_vec()
    }

    #[test]
    fn a_released_slot_reads_zero_and_takes_writes_again() -> Result<()> {
        let arena = Arena::new(ArenaPlan::from_budget(4 * 4096 * 2, 2, 8, 4096)?)?;
        let len = arena.plan().slot_bytes as usize;
        let (a, b) = (arena.slot_ptr(1, 2)?, arena.slot_ptr(1, 3)?);
        // SAFETY: both slots are inside the arena and used by nobody else.
        unsafe {
            std::ptr::write_bytes(a, 0xAB, len);
            std::ptr::write_bytes(b, 0xCD, len);
        }
        // SAFETY: nobody uses slot (1, 2); the arena is not page-locked.
        let given = unsafe { arena.release_slot(1, 2)? };
        if cfg!(target_os = "linux") {
            assert_eq!(given, len, "a 4 KiB-page machine gives the whole slot");
            assert!(
                bytes_at(a, len).iter().all(|&x| x == 0),
                "released pages read 0"
            );
        }
        assert!(
            bytes_at(b, len).iter().all(|&x| x == 0xCD),
            "the next slot is kept"
        );
        // SAFETY: the slot is inside the arena and used by nobody else.
        unsafe { std::ptr::write_bytes(a, 0x11, len) };
        assert!(
            bytes_at(a, len).iter().all(|&x| x == 0x11),
            "writes fault pages in"
        );
        // SAFETY: nobody uses the slot.
        assert!(
            unsafe { arena.release_slot(2, 0) }.is_err(),
            "bounds checked"
        );
        Ok(())
    }

    /// Resident bytes of this process (Linux: /proc/self/statm, in pages).
    fn resident_bytes() -> usize {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
        let pages: usize = statm
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        pages * 4096
    }

    #[test]
    fn a_large_arena_costs_no_memory_until_its_slots_are_written() -> Result<()> {
        if !cfg!(target_os = "linux") {
            return Ok(());
        }
        let before = resident_bytes();
        let plan = ArenaPlan::from_budget(4 << 30, 4, 1 << 10, 1 << 20)?;
        let arena = Arena::new(plan)?;
        assert_eq!(arena.as_ptr() as usize % HUGE_PAGE, 0, "huge-page aligned");
        assert!(
            resident_bytes() < before + (64 << 20),
            "4 GiB arena made resident at creation"
        );
        let p = arena.slot_ptr(3, 1000)?;
        let len = arena.plan().slot_bytes as usize;
        assert!(bytes_at(p, len).iter().all(|&x| x == 0), "reads zero");
        // SAFETY: the slot is inside the arena and used by nobody else.
        unsafe { std::ptr::write_bytes(p, 7, len) };
        assert!(bytes_at(p, len).iter().all(|&x| x == 7));
        Ok(())
    }

    #[test]
    fn slots_are_page_aligned_and_bounds_checked() -> Result<()> {
        let arena = Arena::new(ArenaPlan::from_budget(4 * 4096 * 2, 2, 8, 4096)?)?;
        assert_eq!(arena.len(), 8 * 4096);
        for (layer, slot) in [(0, 0), (0, 3), (1, 0), (1, 3)] {
            assert_eq!(arena.slot_ptr(layer, slot)? as usize % 4096, 0);
        }
        assert_eq!(arena.slot_offset(1, 1)?, 5 * 4096);
        assert!(arena.slot_offset(2, 0).is_err() && arena.slot_offset(0, 4).is_err());
        Ok(())
    }
}
