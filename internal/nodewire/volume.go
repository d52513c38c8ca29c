package nodewire

// FeatureVolumes: the node holds Volume images in its storage pool, applies
// DesiredState.volumes, reports VolumeReport and mounts
// DesiredWorkspace.volume into a workspace at its start. ctrl serves the
// capabilities volume.create and workspace.volume_binding while a node that
// lists it is connected.
const FeatureVolumes = "volumes"
