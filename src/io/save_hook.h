// A test hook into save_safetensors (not public API): the crash and full-disk tests stop or fail
// a save at each of its points in turn, which random timing alone reaches too rarely.
#pragma once

namespace tessera::io::hooks {

// The points of a save, in order. A save calls the hook after each (Data once per tensor).
enum class SavePoint { Created, Header, Data, FileSynced, Closed, Renamed, DirectoryOpened, DirectorySynced };
inline constexpr int kSavePoints = 8;

// Called at each point; a non-zero return is an errno: the save fails there as if the system
// call just made had failed with it (so ENOSPC at Header or Data is a full disk). Null: none.
using SaveHook = int (*)(SavePoint);
void set_save_hook(SaveHook hook);

}  // namespace tessera::io::hooks
