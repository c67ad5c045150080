/**
 * The colour of each page category, for the panel's maps and legend.
 *
 * Twin of `uvm_lab/jupyter/palette.py`, which the bokeh dashboard draws with, so a category has
 * one colour everywhere; a unit test on the Python side checks that the two agree. That module's
 * docstring says why these colours: Okabe and Ito's colour-blind safe hues for the processors,
 * a very light grey for "nowhere" (no data) and a dark neutral grey for "unknown" (may hold data).
 * `CAUSE_PALETTE` colours the timeline's events by cause, from the same module.
 */

import { CategoryName, CauseName } from './protocol';

export const PALETTE: Readonly<Record<CategoryName, string>> = {
  'nowhere': '#eeeeee',
  'host': '#0072b2',
  'both': '#cc79a7',
  'unknown': '#4d4d4d',
  'gpus': '#000000',
  'gpu:0': '#009e73',
  'gpu:1': '#e69f00',
  'gpu:2': '#56b4e9',
  'gpu:3': '#d55e00',
  'gpu:4': '#f0e442',
  'gpu:5': '#332288'
};

export const CAUSE_PALETTE: Readonly<Record<CauseName, string>> = {
  'demand fault': '#d55e00',
  'prefetch': '#0072b2',
  'eviction': '#e69f00',
  'coherence': '#cc79a7',
  'thrashing': '#000000',
  'remote map': '#56b4e9',
  'inferred': '#666666',
  'allocation': '#009e73',
  'advice': '#f0e442'
};
