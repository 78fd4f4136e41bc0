//! Writing a command's output files without ever touching its input: the
//! same file by any path (a hard link, a symlink, `./t.csv` for `t.csv`) is
//! refused before anything is opened for writing, and what is written goes
//! to a temporary file beside the output, renamed over it only once whole.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Whether `a` and `b` name the same file (both existing).
fn same_file(a: &Path, b: &Path) -> bool {
    let (Ok(a_meta), Ok(b_meta)) = (std::fs::metadata(a), std::fs::metadata(b)) else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        a_meta.dev() == b_meta.dev() && a_meta.ino() == b_meta.ino()
    }
    #[cfg(not(unix))]
    {
        let _ = (a_meta, b_meta);
        matches!(
            (a.canonicalize(), b.canonicalize()),
            (Ok(a), Ok(b)) if a == b
        )
    }
}

/// Refuse `output` if it is `input`, by any name.
pub(crate) fn check_not_input(output: &Path, input: &Path) -> Result<(), String> {
    if same_file(output, input) {
        return Err(format!(
            "{}: refusing to write over the input ({} is the same file)",
            output.display(),
            input.display()
        ));
    }
    Ok(())
}

/// A file being written: to a temporary name beside its path, renamed to
/// it by [`commit`](Self::commit); dropped uncommitted, the temporary goes.
pub(crate) struct AtomicFile {
    path: PathBuf,
    temporary: PathBuf,
    writer: Option<BufWriter<File>>,
}

impl AtomicFile {
    /// Start writing `path`.
    pub(crate) fn create(path: &Path) -> Result<Self, String> {
        let name = path
            .file_name()
            .ok_or_else(|| format!("{}: not a file name", path.display()))?;
        let mut temporary_name = std::ffi::OsString::from(".");
        temporary_name.push(name);
        temporary_name.push(format!(".{}.tmp", std::process::id()));
        let temporary = path.with_file_name(temporary_name);
        let file = File::create(&temporary).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
            temporary,
            writer: Some(BufWriter::new(file)),
        })
    }

    /// The temporary file (for a writer that opens it by name; its
    /// content is what [`commit`](Self::commit) puts in place).
    pub(crate) fn temporary_path(&self) -> &Path {
        &self.temporary
    }

    /// Where it is written.
    pub(crate) fn writer(&mut self) -> &mut BufWriter<File> {
        self.writer.as_mut().expect("written until committed")
    }

    /// Flush and put the file in place.
    pub(crate) fn commit(mut self) -> Result<(), String> {
        let fail = |e: &dyn std::fmt::Display| format!("{}: {e}", self.path.display());
        let writer = self.writer.take().expect("committed once");
        let file = writer.into_inner().map_err(|e| fail(&e.error()))?;
        file.sync_all().map_err(|e| fail(&e))?;
        drop(file);
        std::fs::rename(&self.temporary, &self.path).map_err(|e| fail(&e))
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.writer.take().is_some() {
            let _ = std::fs::remove_file(&self.temporary);
        }
    }
}

/// Where a command's output goes: a file written atomically, or standard
/// output (`-`).
pub(crate) enum Output {
    File(AtomicFile),
    Stdout(std::io::StdoutLock<'static>),
}

impl Output {
    /// `-` is standard output; anything else a file, refused if it is `input`.
    pub(crate) fn open(path: &Path, input: &Path) -> Result<Self, String> {
        if path == Path::new("-") {
            return Ok(Self::Stdout(std::io::stdout().lock()));
        }
        check_not_input(path, input)?;
        AtomicFile::create(path).map(Self::File)
    }

    pub(crate) fn commit(self) -> Result<(), String> {
        match self {
            Self::File(file) => file.commit(),
            Self::Stdout(mut out) => out.flush().map_err(|e| format!("standard output: {e}")),
        }
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Self::File(file) => file.writer().write(buf),
            Self::Stdout(out) => out.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Self::File(file) => file.writer().flush(),
            Self::Stdout(out) => out.flush(),
        }
    }
}
