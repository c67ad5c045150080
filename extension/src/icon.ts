import { LabIcon } from '@jupyterlab/ui-components';

// A page grid, some pages filled: the sidebar tab's picture of a residency map.
const svg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 16 16">
  <g class="jp-icon3" fill="#616161">
    <rect x="1" y="1" width="4" height="4" rx="0.5"/>
    <rect x="6" y="1" width="4" height="4" rx="0.5"/>
    <rect x="11" y="1" width="4" height="4" rx="0.5" opacity="0.4"/>
    <rect x="1" y="6" width="4" height="4" rx="0.5"/>
    <rect x="6" y="6" width="4" height="4" rx="0.5" opacity="0.4"/>
    <rect x="11" y="6" width="4" height="4" rx="0.5" opacity="0.4"/>
    <rect x="1" y="11" width="4" height="4" rx="0.5" opacity="0.4"/>
    <rect x="6" y="11" width="4" height="4" rx="0.5" opacity="0.4"/>
    <rect x="11" y="11" width="4" height="4" rx="0.5"/>
  </g>
</svg>`;

export const uvmLabIcon = new LabIcon({ name: 'uvm-lab:residency', svgstr: svg });
