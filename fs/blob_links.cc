#include "fs/blob_links.h"

namespace ckptfs::fs {

std::vector<ObjectId> BlobLinks(const BlobReader& blob) {
  std::vector<ObjectId> links;
  if (blob.base()) links.push_back(*blob.base());
  if (blob.ref()) links.push_back(*blob.ref());
  return links;
}

Status TouchLinked(Store& store, const BlobReader& top) {
  std::vector<ObjectId> pending = BlobLinks(top);
  std::unordered_set<ObjectId, ObjectIdHash> seen(pending.begin(), pending.end());
  while (!pending.empty() && seen.size() <= kMaxLinkedBlobs) {
    const ObjectId id = pending.back();
    pending.pop_back();
    RETURN_IF_ERROR(store.TouchObject(id));
    ASSIGN_OR_RETURN(auto reader, store.OpenBlob(id));
    for (const ObjectId& below : BlobLinks(*reader))
      if (seen.insert(below).second) pending.push_back(below);
  }
  return Status::Ok();
}

}  // namespace ckptfs::fs
