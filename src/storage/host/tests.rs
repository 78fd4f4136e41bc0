//! `HostStorage`: bytes, ranges and the driver's counts.

use super::*;

#[test]
fn bytes_written_read_back_and_copied() {
    let mut storage = HostStorage::new();
    let a = storage.allocate(8192).unwrap();
    let b = storage.allocate(4096).unwrap();
    let src = a.sub_range(100, 104).unwrap();
    storage.write(&src, &[1, 2, 3, 4]).unwrap();
    let dst = b.sub_range(10, 14).unwrap();
    storage.copy(&src, &dst).unwrap();
    let mut out = [0u8; 4];
    storage.read(&dst, &mut out).unwrap();
    assert_eq!(out, [1, 2, 3, 4]);
    // Within one page too, overlapping.
    let shifted = a.sub_range(102, 106).unwrap();
    storage.copy(&src, &shifted).unwrap();
    storage
        .read(&a.sub_range(100, 106).unwrap(), &mut [0; 6])
        .unwrap();
    let mut six = [0u8; 6];
    storage
        .read(&a.sub_range(100, 106).unwrap(), &mut six)
        .unwrap();
    assert_eq!(six, [1, 2, 1, 2, 3, 4]);
    assert_eq!(
        storage.resource(&a).unwrap().addr % HOST_PAGE_ALIGN as u64,
        0
    );
}

#[test]
fn deallocation_waits_for_flush() {
    let mut storage = HostStorage::new();
    let a = storage.allocate(4096).unwrap();
    storage.deallocate(a.id);
    storage.deallocate(a.id);
    assert_eq!(storage.bytes_allocated(), 4096);
    storage.flush();
    assert_eq!(storage.bytes_allocated(), 0);
    assert_eq!(storage.resource(&a), Err(StorageError::UnknownPage(a.id)));
}

#[cfg(unix)]
#[test]
fn a_range_holds_bytes_where_mapped_and_forgets_them_when_unmapped() {
    let mut storage = HostStorage::new();
    let g = HOST_GRANULE;
    let range = storage.reserve_range(4 * g).unwrap();
    let base = storage.resource(&range).unwrap().addr;
    assert_eq!(base % 4096, 0);
    let second = range.sub_range(g, 2 * g).unwrap();
    // Not mapped yet: refused, not a fault.
    let bytes = range.sub_range(g + 10, g + 14).unwrap();
    assert!(matches!(
        storage.write(&bytes, &[1, 2, 3, 4]),
        Err(StorageError::Unmapped { .. })
    ));
    storage.map(&second).unwrap();
    assert_eq!(storage.bytes_allocated(), g);
    storage.write(&bytes, &[1, 2, 3, 4]).unwrap();
    let third = range.sub_range(2 * g, 3 * g).unwrap();
    storage.map(&third).unwrap();
    let moved = range.sub_range(2 * g + 8, 2 * g + 12).unwrap();
    storage.copy(&bytes, &moved).unwrap();
    // A copy across the two mapped granules.
    let across = range.sub_range(2 * g - 2, 2 * g + 2).unwrap();
    storage.write(&across, &[9, 8, 7, 6]).unwrap();
    let mut out = [0u8; 4];
    storage.read(&moved, &mut out).unwrap();
    assert_eq!(out, [1, 2, 3, 4]);
    storage.read(&across, &mut out).unwrap();
    assert_eq!(out, [9, 8, 7, 6]);
    storage.unmap(&second);
    storage.flush();
    assert_eq!(storage.bytes_allocated(), g);
    assert!(storage.read(&bytes, &mut out).is_err());
    // Mapped again: zero, as fresh memory.
    storage.map(&second).unwrap();
    storage.read(&bytes, &mut out).unwrap();
    assert_eq!(out, [0; 4]);
    storage.read(&moved, &mut out).unwrap();
    assert_eq!(out, [1, 2, 3, 4]);
    storage.deallocate(range.id);
    storage.flush();
    assert_eq!(storage.bytes_allocated(), 0);
}

#[test]
fn out_of_range_is_an_error() {
    let mut storage = HostStorage::new();
    let a = storage.allocate(4096).unwrap();
    let beyond = StorageHandle {
        id: a.id,
        offset: 4000,
        size: 200,
    };
    assert!(matches!(
        storage.write(&beyond, &[0; 10]),
        Err(StorageError::OutOfRange { .. })
    ));
    assert!(matches!(
        storage.read(&a, &mut vec![0; 5000]),
        Err(StorageError::OutOfRange { .. })
    ));
    assert_eq!(storage.allocate(0), Err(StorageError::InvalidSize(0)));
}
