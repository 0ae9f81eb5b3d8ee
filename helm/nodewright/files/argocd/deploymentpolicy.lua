-- Argo CD health of a nodewright.io DeploymentPolicy
-- (resource.customizations.health.nodewright.io_DeploymentPolicy). A policy is rules only: it is
-- healthy once the operator has read its current generation (status.observedGeneration). It has no
-- pause of its own (pausing is per NodeWright), so it is never Suspended.
local hs = {}
local status = obj.status or {}
local generation = obj.metadata and obj.metadata.generation
if obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "being deleted"
elseif status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "waiting for the operator to read the policy"
elseif generation ~= nil and status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "waiting for the operator to read generation " .. tostring(generation)
else
  hs.status = "Healthy"
  local compartments = status.compartmentCount or 0
  hs.message = tostring(compartments) .. " compartment(s) besides the default, default strategy "
    .. tostring(status.defaultStrategy or "none")
end
return hs
