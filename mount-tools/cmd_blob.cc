#include "mount-tools/commands.h"

namespace ckptfs::tools {

void RegisterBlobCommands(CLI::App& /*app*/, int* /*exit_code*/) {}

}  // namespace ckptfs::tools
