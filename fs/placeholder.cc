// The filesystem layer lands with the FUSE daemon; this keeps the target
// non-empty until then.
namespace ckptfs::fs {
int LayerVersion() { return 0; }
}  // namespace ckptfs::fs
