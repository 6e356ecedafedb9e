//! The directory walker: an open directory, and everything in it opened
//! relative to its descriptor.
//!
//! Directories are opened once and everything in them is opened relative
//! to that descriptor, never by path again, so a directory replaced by a
//! symbolic link after it was opened changes nothing; a subdirectory that
//! is a symbolic link is refused. A file is first opened with `O_PATH`
//! (which opens nothing but the name's inode) and checked to be a regular
//! file, so a FIFO or device planted under a page's name is never opened
//! for reading; it is then reopened through `/proc/self/fd`, so the inode
//! checked is the one read, whatever happens to the name meanwhile. A file
//! is removed (`unlinkat`) only if its name still leads to the file that
//! was read.

use std::ffi::{CStr, CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Which file a name led to (device and inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileId {
    dev: u64,
    ino: u64,
}

/// What an opened file is.
pub(super) struct FileInfo {
    pub(super) id: FileId,
    pub(super) uid: u32,
    pub(super) size: u64,
}

/// Why a file was not opened.
pub(super) enum NotOpened {
    /// Gone since it was listed.
    Gone,
    Skip(String),
}

/// An open directory and the path it was reached by (for messages and
/// snapshots). Everything below it is opened relative to the descriptor,
/// never by path again, so a directory replaced by a symbolic link after it
/// was opened changes nothing.
pub(super) struct Dir {
    fd: OwnedFd,
    pub(super) path: PathBuf,
}

pub(super) fn last_error() -> io::Error {
    io::Error::last_os_error()
}

fn c_name(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in a name"))
}

/// Takes ownership of a descriptor a call just returned (or its error).
fn owned(fd: libc::c_int) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(last_error());
    }
    // SAFETY: a fresh descriptor, owned from here on.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Dir {
    /// The directory at `path`, symbolic links in it followed: the path is
    /// the reader's own choice.
    pub(super) fn open(path: &Path) -> io::Result<Dir> {
        let c = c_name(path.as_os_str().as_bytes())?;
        // SAFETY: a valid NUL-terminated path.
        let fd = owned(unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        })?;
        Ok(Dir {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// The directory `fd` (opened and checked by the caller), reached by `path`.
    pub(super) fn from_fd(fd: OwnedFd, path: PathBuf) -> Dir {
        Dir { fd, path }
    }

    /// The subdirectory `name`; a symbolic link is refused (ELOOP or
    /// ENOTDIR), whoever controls this directory.
    pub(super) fn sub(&self, name: &OsStr) -> io::Result<Dir> {
        let c = c_name(name.as_bytes())?;
        // SAFETY: an open directory and a valid name.
        let fd = owned(unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        })?;
        Ok(Dir {
            fd,
            path: self.path.join(name),
        })
    }

    /// The names in the directory (not `.` and `..`) that `keep` accepts,
    /// sorted, looking at `max` names at most (see [`Listing`]).
    pub(super) fn list(&self, max: usize, keep: impl Fn(&[u8]) -> bool) -> io::Result<Listing> {
        // fdopendir takes its descriptor over: give it a duplicate, and
        // rewind, as the duplicate shares the position of ours.
        // SAFETY: duplicating an open descriptor.
        let dup = unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(last_error());
        }
        // SAFETY: dup is an open directory descriptor that the stream owns
        // from here on (closedir closes it).
        let stream = unsafe { libc::fdopendir(dup) };
        if stream.is_null() {
            let e = last_error();
            // SAFETY: fdopendir failed, so dup is still ours to close.
            unsafe { libc::close(dup) };
            return Err(e);
        }
        // SAFETY: a valid stream.
        unsafe { libc::rewinddir(stream) };
        let mut out = Listing {
            names: Vec::new(),
            looked: 0,
            complete: false,
        };
        let result = loop {
            // SAFETY: errno is thread-local; clearing it tells the end of
            // the directory (NULL, errno 0) from an error.
            unsafe { *libc::__errno_location() = 0 };
            // SAFETY: a valid stream, used by this thread only.
            let entry = unsafe { libc::readdir(stream) };
            if entry.is_null() {
                let e = last_error();
                out.complete = true;
                break if e.raw_os_error().unwrap_or(0) == 0 {
                    Ok(())
                } else {
                    Err(e)
                };
            }
            // SAFETY: readdir returned a valid entry with a NUL-terminated name.
            let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) }.to_bytes();
            if name != b"." && name != b".." {
                if out.looked == max {
                    break Ok(()); // one more than allowed: not complete
                }
                out.looked += 1;
                if keep(name) {
                    out.names.push(OsStr::from_bytes(name).to_os_string());
                }
            }
        };
        // SAFETY: closing the stream opened above (and its descriptor).
        unsafe { libc::closedir(stream) };
        result?;
        out.names.sort();
        Ok(out)
    }

    /// Opens the regular file `name` without following a link, checking its
    /// type before anything else: a device node or FIFO planted under a
    /// page's name is never opened for reading. The inode checked is the
    /// one opened (through /proc/self/fd), whatever happens to the name
    /// meanwhile. `write(info)` says, once the file is known, whether to
    /// open it for writing.
    pub(super) fn open_file(
        &self,
        name: &OsStr,
        write: impl FnOnce(&FileInfo) -> bool,
    ) -> Result<(std::fs::File, FileInfo), NotOpened> {
        let c = c_name(name.as_bytes())
            .map_err(|_| NotOpened::Skip("the name holds a NUL byte".into()))?;
        // SAFETY: an open directory and a valid name; O_PATH opens nothing
        // but the name's inode.
        let path_fd = match owned(unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        }) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Err(NotOpened::Gone),
            Err(e) => return Err(NotOpened::Skip(format!("cannot open: {e}"))),
        };
        // SAFETY: zeroed stat is a valid out-buffer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: an open descriptor and a valid out-buffer.
        if unsafe { libc::fstat(path_fd.as_raw_fd(), &mut st) } != 0 {
            return Err(NotOpened::Skip(format!("cannot inspect: {}", last_error())));
        }
        match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => {}
            libc::S_IFLNK => return Err(NotOpened::Skip("a symbolic link, not a page".into())),
            _ => return Err(NotOpened::Skip("not a regular file".into())),
        }
        let info = FileInfo {
            id: FileId {
                dev: st.st_dev,
                ino: st.st_ino,
            },
            uid: st.st_uid,
            size: st.st_size as u64,
        };
        let again = c_name(format!("/proc/self/fd/{}", path_fd.as_raw_fd()).as_bytes())
            .map_err(|e| NotOpened::Skip(e.to_string()))?;
        let mode = if write(&info) {
            libc::O_RDWR
        } else {
            libc::O_RDONLY
        };
        // SAFETY: a valid path naming the inode held by path_fd.
        let fd = owned(unsafe {
            libc::open(
                again.as_ptr(),
                mode | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY,
            )
        })
        .map_err(|e| NotOpened::Skip(format!("cannot open: {e}")))?;
        Ok((std::fs::File::from(fd), info))
    }

    /// Removes `name` if it is still the file `st` describes.
    pub(super) fn remove_if_same(&self, name: &OsStr, id: FileId) -> bool {
        let Ok(c) = c_name(name.as_bytes()) else {
            return false;
        };
        // SAFETY: zeroed stat is a valid out-buffer.
        let mut now: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: an open directory, a valid name and out-buffer.
        let same = unsafe {
            libc::fstatat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                &mut now,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        } == 0
            && now.st_dev == id.dev
            && now.st_ino == id.ino;
        // SAFETY: an open directory and a valid name.
        same && unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) } == 0
    }
}

/// What [`Dir::list`] found.
pub(super) struct Listing {
    /// The names kept, sorted.
    pub(super) names: Vec<OsString>,
    /// Names looked at (kept or not).
    pub(super) looked: usize,
    /// Whether the whole directory was looked at.
    pub(super) complete: bool,
}

/// Whether `name` ends in `.ext` after at least one character.
pub(super) fn has_extension(name: &[u8], ext: &str) -> bool {
    Path::new(OsStr::from_bytes(name))
        .extension()
        .is_some_and(|x| x.as_bytes() == ext.as_bytes())
}
