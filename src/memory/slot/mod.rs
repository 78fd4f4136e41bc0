//! Where each live allocation is recorded, and the two packed words a
//! handle's cell shares with its owner: the slot key and the pin word.

mod key;
mod pin;
mod table;
mod users;

pub(crate) use key::SlotKey;
pub(crate) use pin::{PinWord, Unpinned};
pub(crate) use table::{Live, SlotTable};
pub(crate) use users::Users;
