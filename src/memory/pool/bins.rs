//! Size classes with bounded waste: a tiny floating-point format with three
//! mantissa bits, so each power of two splits into eight classes and a size
//! rounded up to its class wastes at most 12.5%. This is the binning of
//! Sebastian Aaltonen's `OffsetAllocator` (and of TLSF), widened to 64-bit
//! sizes.

/// Mantissa bits: eight classes per power of two.
const MANTISSA_BITS: u32 = 3;
const MANTISSA_VALUE: u64 = 1 << MANTISSA_BITS;
const MANTISSA_MASK: u64 = MANTISSA_VALUE - 1;

/// Classes per power of two.
pub(crate) const LEAVES: usize = MANTISSA_VALUE as usize;
/// Powers of two covered (every `u64`).
pub(crate) const TOPS: usize = 64;
/// Total number of classes.
pub(crate) const BINS: usize = TOPS * LEAVES;

/// The smallest class whose size is at least `size`.
pub(crate) fn round_up(size: u64) -> usize {
    class(size, true)
}

/// The largest class whose size is at most `size`.
pub(crate) fn round_down(size: u64) -> usize {
    class(size, false)
}

fn class(size: u64, up: bool) -> usize {
    if size < MANTISSA_VALUE {
        return size as usize;
    }
    let highest = 63 - size.leading_zeros();
    let shift = highest - MANTISSA_BITS;
    let exponent = u64::from(shift + 1);
    let mut mantissa = (size >> shift) & MANTISSA_MASK;
    if up && size & ((1 << shift) - 1) != 0 {
        // A carry out of the mantissa moves to the next exponent by itself.
        mantissa += 1;
    }
    ((exponent << MANTISSA_BITS) + mantissa) as usize
}

/// The size a class stands for (its smallest member).
pub(crate) fn class_size(bin: usize) -> u64 {
    let exponent = (bin >> MANTISSA_BITS) as u32;
    let mantissa = (bin as u64) & MANTISSA_MASK;
    if exponent == 0 {
        mantissa
    } else {
        (mantissa | MANTISSA_VALUE) << (exponent - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_bound_waste_and_order() {
        for size in (1..5000u64).chain([1 << 20, (1 << 20) + 1, 3 << 30, u64::MAX >> 4]) {
            let up = class_size(round_up(size));
            let down = class_size(round_down(size));
            assert!(up >= size && down <= size, "size {size}: {down}..{up}");
            assert!(up - size <= size / 8 + 1, "waste over 12.5% at {size}");
        }
        for bin in 1..round_up(u64::MAX >> 4) {
            assert!(class_size(bin) < class_size(bin + 1));
            assert_eq!(round_up(class_size(bin)), bin);
            assert_eq!(round_down(class_size(bin)), bin);
        }
    }
}
